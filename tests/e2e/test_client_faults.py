"""What a client causes is never held against a backend, and no error a client sees names a
backend's address: real sim workers behind a real gateway, spoken to over raw HTTP."""

from __future__ import annotations

import http.client
import json
import re
import urllib.request
from collections.abc import Iterator

import pytest

from tests.e2e.procs import free_port, gateway, metric, sim_workers

MODEL = "sim-8b"
DEAD = "gone-8b"  # a pool whose one backend listens nowhere
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    with sim_workers(MODEL, 2) as workers:
        dead = f"http://127.0.0.1:{free_port()}"
        config = tmp_path_factory.mktemp("gw") / "gw.yaml"
        config.write_text(json.dumps({"pools": [
            {"model": MODEL, "policy": "round_robin", "backends": [{"url": u} for u in workers],
             "retries": {"max_attempts": 2, "backoff_base_s": 0.001, "backoff_max_s": 0.002}},
            {"model": DEAD, "backends": [{"url": dead}]},
        ]}))  # fmt: skip
        with gateway(["--config", str(config)]) as (url, _):
            yield url, [*workers, dead]


def post(url: str, body: dict[str, object], **headers: str) -> tuple[int, bytes]:
    host, port = url[7:].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", CHAT, json.dumps(body), {"content-type": "application/json", **headers})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def chat(model: str = MODEL, **fields: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            **fields}  # fmt: skip


def healthy(url: str, backends: list[str]) -> list[float]:
    return [metric(url, "fleetgate_backend_healthy", backend=b[7:]) for b in backends]


def set_faults(worker: str, **faults: object) -> None:
    request = urllib.request.Request(
        worker + "/admin/faults", data=json.dumps(faults).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def test_a_timeout_the_client_shortened_never_ejects_a_backend(
    fleet: tuple[str, list[str]],
) -> None:
    url, backends = fleet
    workers = backends[:2]
    for worker in workers:  # answers take 0.3 s: longer than the client will wait
        set_faults(worker, added_latency_s=0.3)
    try:
        for _ in range(8):  # each tries both workers: 16 timeouts, 8 for each
            status, body = post(url, chat(), **{"x-fleetgate-first-byte-timeout-s": "0.0001"})
            assert status == 504, body
    finally:
        for worker in workers:
            set_faults(worker, added_latency_s=0.0)
    assert healthy(url, workers) == [1, 1]
    assert metric(url, "fleetgate_upstream_errors_total", kind="client_timeout") >= 8
    assert metric(url, "fleetgate_upstream_errors_total", kind="timeout") == 0
    assert [post(url, chat())[0] for _ in range(4)] == [200] * 4


def test_no_error_names_a_backend_s_address(fleet: tuple[str, list[str]]) -> None:
    url, backends = fleet
    addresses = [b[7:] for b in backends]
    answers = [post(url, chat(DEAD))]  # connection refused
    for worker in backends[:2]:  # slow, then streams cut: no continuation can finish
        set_faults(worker, added_latency_s=0.3)
    try:
        answers.append(post(url, chat(), **{"x-fleetgate-first-byte-timeout-s": "0.1"}))
        for worker in backends[:2]:
            set_faults(worker, added_latency_s=0.0, close_after_tokens=2)
        answers.append(post(url, chat(stream=True, max_tokens=50)))
    finally:
        for worker in backends[:2]:
            set_faults(worker, added_latency_s=0.0, close_after_tokens=0)
    assert [status for status, _ in answers] == [502, 504, 200]
    assert b"could not go on" in answers[2][1]  # the stream's error event
    for _, body in answers:
        text = body.decode()
        assert not any(a in text for a in addresses), text
        assert not re.search(r"\d+\.\d+\.\d+\.\d+", text), text
    assert f"Backend {DEAD}#0 failed" in answers[0][1].decode()
