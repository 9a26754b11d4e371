"""Graceful drain: of one backend through the admin API, and of the whole gateway on SIGTERM;
a backend added to and removed from a running gateway."""

from __future__ import annotations

import json
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.procs import Proc, gateway, get, metric, sim_workers

MODEL = "sim-8b"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, list[str], Proc]]:
    with sim_workers(MODEL, 2) as workers:
        config = tmp_path / "gw.yaml"
        config.write_text(json.dumps({
            "server": {"admin": True, "drain_timeout_s": 20},
            "pools": [{"model": MODEL, "policy": "round_robin",
                       "backends": [{"url": w} for w in workers]}],
        }))  # fmt: skip
        with gateway(["--config", str(config)]) as (url, proc):
            yield url, workers, proc


def post(url: str, body: object, method: str = "POST") -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_drained_backend_gets_no_new_requests_until_undrained(
    fleet: tuple[str, list[str], Proc],
) -> None:
    url, workers, _ = fleet
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    drained = workers[0][7:]
    status, listing = post(url + "/admin/drain", {"backend": drained, "draining": True})
    assert status == 200
    assert any(b["backend"] == drained and b["flags"] == ["DRAINING"] for b in listing)  # type: ignore[union-attr]
    for _ in range(6):
        client.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert metric(workers[0], "vllm:request_success_total") == 0
    assert post(url + "/admin/drain", {"backend": drained, "draining": False})[0] == 200
    for _ in range(6):
        client.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert metric(workers[0], "vllm:request_success_total") >= 2
    assert post(url + "/admin/drain", {"backend": "nope:1"})[0] == 404
    with urllib.request.urlopen(url + "/admin/backends", timeout=5) as response:
        listing = json.loads(response.read())
    assert all(b["ewma_e2e_s"] is not None and b["verdict"] == "healthy" for b in listing)


def test_a_backend_added_at_run_time_takes_requests_until_it_is_removed(
    fleet: tuple[str, list[str], Proc],
) -> None:
    url, workers, _ = fleet
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    with sim_workers(MODEL, 1) as (extra,):
        status, added = post(url + "/admin/backends", {"model": MODEL, "url": extra})
        assert status == 201 and added["name"] == f"{MODEL}#2"  # type: ignore[index]
        for _ in range(6):  # round robin over three
            client.completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert metric(extra, "vllm:request_success_total") == 2
        backend = extra[7:]
        status, gone = post(url + "/admin/backends?backend=" + backend, None, "DELETE")
        assert (status, gone) == (200, {"backend": backend, "models": [MODEL], "in_flight": 0})
        for _ in range(6):
            client.completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert metric(extra, "vllm:request_success_total") == 2
    _, _, body = get(url + "/admin/backends")
    assert [b["backend"] for b in json.loads(body)] == [w[7:] for w in workers]


def test_sigterm_lets_streams_in_progress_finish_then_exits(
    fleet: tuple[str, list[str], Proc],
) -> None:
    url, _, proc = fleet
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "long"}], max_tokens=300, stream=True
    )
    pieces: list[str] = []
    first = threading.Event()

    def read() -> None:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
                first.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert first.wait(10)
    proc.popen.send_signal(signal.SIGTERM)
    reader.join(30)
    assert len(pieces) == 300  # the stream in progress finished in full
    assert proc.popen.wait(30) == 0
    with pytest.raises(urllib.error.URLError, match="refused"):
        get(url + "/healthz")  # and nothing listens any more
