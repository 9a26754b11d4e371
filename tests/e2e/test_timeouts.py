"""A backend that hangs or never finishes costs the client at most the pool's timeouts."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator

import openai
import pytest

from tests.e2e.procs import gateway, get, metric, sim_workers

MODEL = "sim-8b"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with sim_workers(MODEL, 1) as workers:
        config = tmp_path_factory.mktemp("gw") / "gw.yaml"
        pool = {"model": MODEL, "first_byte_timeout_s": 0.5, "total_timeout_s": 1.5,
                "health_check": {"interval_s": 0.2, "timeout_s": 0.2, "jitter": 0.1,
                                 "unhealthy_threshold": 2, "healthy_threshold": 1},
                "backends": [{"url": workers[0]}]}  # fmt: skip
        config.write_text(json.dumps({"pools": [pool]}))
        with gateway(["--config", str(config)]) as (url, _):
            yield url, workers[0]


def set_faults(worker: str, **faults: object) -> None:
    request = urllib.request.Request(
        worker + "/admin/faults", data=json.dumps(faults).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def test_a_hung_backend_gets_a_504_after_the_first_byte_timeout(fleet: tuple[str, str]) -> None:
    url, worker = fleet
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    set_faults(worker, hang=True)
    try:
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        elapsed = time.monotonic() - started
    finally:
        set_faults(worker, hang=False)
    assert info.value.status_code == 504
    assert "first-byte timeout" in str(info.value)
    assert 0.4 < elapsed < 3.0
    assert metric(url, "fleetgate_upstream_errors_total", kind="timeout") >= 1
    assert metric(url, "fleetgate_backend_in_flight_requests") == 0
    assert metric(url, "fleetgate_backend_pending_prefill_tokens") == 0
    assert metric(url, "fleetgate_backend_in_flight_tokens") == 0


def test_a_stream_past_the_total_timeout_ends_with_an_error_event(fleet: tuple[str, str]) -> None:
    url, _ = fleet
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5000, stream=True
    )
    tokens: list[str] = []

    def read_all() -> None:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                tokens.append(chunk.choices[0].delta.content)

    with pytest.raises(openai.APIError) as info:
        read_all()
    assert tokens  # it streamed, then ended with the gateway's error, not silently
    assert "total timeout" in str(info.value)


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_active_checks_take_a_hanging_backend_out_and_bring_it_back(
    fleet: tuple[str, str],
) -> None:
    url, worker = fleet
    backend = worker[7:]
    set_faults(worker, hang=True)
    try:
        wait_until(lambda: metric(url, "fleetgate_backend_healthy", backend=backend) == 0)
        assert get(url + "/readyz")[0] == 503
    finally:
        set_faults(worker, hang=False)
    wait_until(lambda: metric(url, "fleetgate_backend_healthy", backend=backend) == 1)
    assert get(url + "/readyz")[0] == 200


def test_a_stream_gone_quiet_ends_after_the_idle_timeout_set_by_header(
    fleet: tuple[str, str],
) -> None:
    url, worker = fleet
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=400, stream=True,
        extra_headers={"x-fleetgate-idle-timeout-s": "0.3", "x-fleetgate-total-timeout-s": "30"},
    )  # fmt: skip
    tokens: list[str] = []

    def read_all() -> None:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                tokens.append(chunk.choices[0].delta.content)
                if len(tokens) == 3:
                    set_faults(worker, slowdown=2000.0)  # the next step takes seconds

    try:
        with pytest.raises(openai.APIError) as info:
            read_all()
    finally:
        set_faults(worker, slowdown=1.0)
    assert len(tokens) >= 3
    assert "idle timeout" in str(info.value)


def test_a_bad_timeout_header_is_a_400_naming_it(fleet: tuple[str, str]) -> None:
    client = openai.OpenAI(base_url=fleet[0] + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            extra_headers={"x-fleetgate-total-timeout-s": "soon"},
        )  # fmt: skip
    assert "x-fleetgate-total-timeout-s" in str(info.value)
