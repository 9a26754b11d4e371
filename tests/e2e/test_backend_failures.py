"""Failures of single workers that clients must not notice (issue 4's chaos cases a, d, e, f),
with real worker processes, a real gateway and the openai SDK."""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import openai
import pytest

from tests.e2e.procs import Proc, fleetgate, gateway, metric

MODEL = "sim-8b"


def start_workers(stack: ExitStack, n: int) -> list[tuple[str, Proc]]:
    workers = []
    for _ in range(n):
        proc = stack.enter_context(fleetgate(["worker", "sim", "--port", "0", "--model", MODEL]))
        port = proc.wait_for(r"on http://127\.0\.0\.1:(\d+)")[0]
        workers.append((f"http://127.0.0.1:{port}", proc))
    return workers


def start_fleet(
    stack: ExitStack,
    tmp_path: Path,
    n: int,
    server: dict[str, object] | None = None,
    **pool: object,
) -> tuple[str, list[tuple[str, Proc]]]:
    """`n` workers in their own processes behind a gateway whose one pool has `pool`'s keys
    (round robin unless given); returns the gateway's URL and the workers."""
    workers = start_workers(stack, n)
    config = tmp_path / "gw.yaml"
    pool = {"model": MODEL, "policy": "round_robin", **pool,
            "backends": [{"url": url} for url, _ in workers]}  # fmt: skip
    config.write_text(json.dumps({"server": server or {}, "pools": [pool]}))
    url, _ = stack.enter_context(gateway(["--config", str(config)]))
    return url, workers


def set_faults(worker: str, **faults: object) -> None:
    request = urllib.request.Request(
        worker + "/admin/faults", data=json.dumps(faults).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, list[tuple[str, Proc]]]]:
    with ExitStack() as stack:
        yield start_fleet(stack, tmp_path, 4)


def ask(client: openai.OpenAI) -> int:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=20
    )
    assert reply.usage is not None
    return reply.usage.completion_tokens


def test_kill_9_of_one_worker_under_load_is_invisible_to_clients(
    fleet: tuple[str, list[tuple[str, Proc]]],
) -> None:
    url, workers = fleet
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    with ThreadPoolExecutor(8) as pool:
        before = [pool.submit(ask, client) for _ in range(40)]
        time.sleep(0.2)  # mid-load, as a crash would come
        workers[0][1].popen.send_signal(signal.SIGKILL)
        after = [pool.submit(ask, client) for _ in range(60)]
        results = [f.result(timeout=60) for f in before + after]
    assert results == [20] * 100  # every request answered in full: no client saw the crash
    assert metric(url, "fleetgate_backend_healthy", backend=workers[0][0][7:]) == 0


def test_backpressure_is_not_a_failure_and_traffic_returns_after_retry_after(
    fleet: tuple[str, list[tuple[str, Proc]]],
) -> None:
    url, workers = fleet
    busy = workers[1][0]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    set_faults(busy, error_rate=1.0, error_status=503)  # answers 503 + Retry-After: 1
    assert [ask(client) for _ in range(20)] == [20] * 20
    assert metric(url, "fleetgate_backend_healthy", backend=busy[7:]) == 1  # not ejected
    served_while_busy = metric(busy, "vllm:request_success_total")
    set_faults(busy, error_rate=0.0)
    time.sleep(1.2)  # the advertised Retry-After
    for _ in range(12):
        ask(client)
    assert metric(busy, "vllm:request_success_total") > served_while_busy


def test_a_failing_worker_is_ejected_and_client_errors_never_eject(
    fleet: tuple[str, list[tuple[str, Proc]]],
) -> None:
    url, workers = fleet
    bad = workers[2][0]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    for _ in range(10):  # requests the client got wrong: 400s from every worker
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=10**6
            )
    assert all(metric(url, "fleetgate_backend_healthy", backend=w[7:]) == 1 for w, _ in workers)
    set_faults(bad, error_rate=1.0, error_status=500)
    assert [ask(client) for _ in range(40)] == [20] * 40  # retried elsewhere, then ejected
    assert metric(url, "fleetgate_backend_healthy", backend=bad[7:]) == 0
    assert metric(url, "fleetgate_retries_total") >= 1


def closed_port() -> int:
    """A localhost port nothing listens on: connecting to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_refused_connect_is_retried_past_a_spent_budget_and_a_failure_is_not(
    tmp_path: Path,
) -> None:
    """The retry budget bounds the extra work retries put on the fleet: a retry after a
    refused connect adds none, so it goes even when the budget is spent; a retry after a 500
    would, so it does not, and the refusal is counted."""
    with ExitStack() as stack:
        workers = start_workers(stack, 2)
        dead = f"http://127.0.0.1:{closed_port()}"
        pool = {
            "model": MODEL, "policy": "round_robin",
            "backends": [{"url": u} for u in [dead, workers[0][0], workers[1][0]]],
            "retries": {"budget_ratio": 0.0, "budget_min": 0},
            "health_check": {"enabled": False}, "engine_metrics": {"enabled": False},
            "outlier": {"consecutive_failures": 1000, "min_requests": 1000},
        }  # fmt: skip
        config = tmp_path / "gw.yaml"
        config.write_text(json.dumps({"pools": [pool]}))
        url, _ = stack.enter_context(gateway(["--config", str(config)]))
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        assert [ask(client) for _ in range(6)] == [20] * 6  # two of them tried `dead` first
        assert metric(url, "fleetgate_retries_total") >= 2
        assert metric(url, "fleetgate_retries_refused_total") == 0
        set_faults(workers[1][0], error_rate=1.0, error_status=500)
        failed = 0
        for _ in range(6):
            try:
                ask(client)
            except openai.InternalServerError:
                failed += 1
        assert failed >= 2  # what reached the failing worker was not retried
        assert metric(url, "fleetgate_retries_refused_total") == failed


def stream_tokens(client: openai.OpenAI, max_tokens: int = 60) -> tuple[int, set[str], int]:
    """(text chunks, ids seen, usage.completion_tokens) of one streamed answer."""
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "tell me"}], max_tokens=max_tokens,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    pieces, ids, usage = 0, set(), -1
    for chunk in stream:
        ids.add(chunk.id)
        if chunk.choices and chunk.choices[0].delta.content:
            pieces += 1
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return pieces, ids, usage


def test_a_stream_cut_mid_answer_is_continued_on_another_worker_as_one_stream(
    fleet: tuple[str, list[tuple[str, Proc]]],
) -> None:
    url, workers = fleet
    set_faults(workers[0][0], close_after_tokens=7)
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    for _ in range(8):  # round robin: two of these start on the cutting worker
        pieces, ids, usage = stream_tokens(client)
        assert (pieces, len(ids), usage) == (60, 1, 60)
    assert metric(url, "fleetgate_stream_continuations_total") >= 2


def test_kill_9_during_streaming_load_breaks_no_stream(
    fleet: tuple[str, list[tuple[str, Proc]]],
) -> None:
    url, workers = fleet
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(stream_tokens, client, 200) for _ in range(24)]
        time.sleep(0.5)  # streams are mid-answer on every worker
        workers[1][1].popen.send_signal(signal.SIGKILL)
        results = [f.result(timeout=60) for f in futures]
    assert all(pieces == 200 and len(ids) == 1 for pieces, ids, _ in results), results
    assert metric(url, "fleetgate_stream_continuations_total") >= 1


def test_a_hanging_worker_costs_a_client_at_most_the_first_byte_timeout_and_a_retry(
    tmp_path: Path,
) -> None:
    with ExitStack() as stack:
        url, workers = start_fleet(stack, tmp_path, 2, first_byte_timeout_s=0.5)
        set_faults(workers[0][0], hang=True)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for _ in range(4):  # round robin: two of them are sent to the hanging worker first
            started = time.monotonic()
            assert ask(client) == 20
            assert time.monotonic() - started < 0.5 + 0.1 + 1.0  # timeout, a tick, a retry
        assert metric(url, "fleetgate_retries_total") >= 1
        assert metric(url, "fleetgate_upstream_errors_total", kind="timeout") >= 1


def test_a_late_first_token_is_hedged_to_another_worker(tmp_path: Path) -> None:
    with ExitStack() as stack:
        hedge = {"enabled": True, "max_delay_s": 0.2}
        url, workers = start_fleet(stack, tmp_path, 2, hedge=hedge)
        set_faults(workers[0][0], added_latency_s=1.5)  # its first token is always late
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for _ in range(4):  # round robin: two of them start on the slow worker
            started = time.monotonic()
            pieces, ids, usage = stream_tokens(client, 30)
            assert (pieces, len(ids), usage) == (30, 1, 30)
            assert time.monotonic() - started < 1.2  # never waited for the slow worker
        assert metric(url, "fleetgate_hedges_total") >= 2


def test_a_worker_failing_half_its_requests_is_ejected_and_returns_through_slow_start(
    tmp_path: Path,
) -> None:
    with ExitStack() as stack:
        url, workers = start_fleet(
            stack, tmp_path, 4, {"admin": True},
            slow_start_s=3.0, outlier={"min_requests": 10, "base_ejection_s": 1.0},
        )  # fmt: skip
        flaky = workers[0][0]
        set_faults(flaky, error_rate=0.5, error_status=500)  # at 0.3, 1 run in 4 stayed in
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for _ in range(80):
            assert ask(client) == 20  # the 500s were retried elsewhere
            if metric(url, "fleetgate_backend_healthy", backend=flaky[7:]) == 0:
                break
        assert metric(url, "fleetgate_backend_healthy", backend=flaky[7:]) == 0
        set_faults(flaky, error_rate=0.0)
        time.sleep(1.1)  # the first ejection lasts base_ejection_s
        ask(client)  # routing notices the ejection is over
        with urllib.request.urlopen(url + "/admin/backends", timeout=5) as response:
            listing = json.loads(response.read())
        back = next(b for b in listing if b["backend"] == flaky[7:])
        assert back["flags"] == []
        assert back["weight"] < 0.5  # slow start: it ramps up from a tenth of its weight
