"""Two real gateway processes on one real Redis (`--state`): each routes by the requests both
have in flight, a gateway that dies is counted out after its lease's TTL, and a prompt's
follow-up sent to the other gateway goes where the first gateway sent the prompt."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from tests.e2e.procs import Proc, gateway, metric, sim_workers
from tests.redis_server import RedisServer

MODEL = "shared-8b"
IN_FLIGHT = "fleetgate_backend_in_flight_requests"
STREAMS = 3


@pytest.fixture(scope="module")
def worker() -> Iterator[str]:
    with sim_workers(MODEL, 1) as urls:
        yield urls[0]


@pytest.fixture(scope="module")
def four() -> Iterator[list[str]]:
    with sim_workers(MODEL, 4) as urls:
        yield urls


@contextmanager
def two_gateways(
    backends: list[str], redis: RedisServer, tmp_path: Path, pool: dict[str, object] | None = None
) -> Iterator[tuple[tuple[str, Proc], tuple[str, Proc]]]:
    """Two gateways over one pool of `backends` (with `pool`'s settings too), on `redis`."""
    config = tmp_path / "gw.yaml"
    config.write_text(json.dumps({
        "pools": [{"model": MODEL, "backends": [{"url": u} for u in backends], **(pool or {})}],
        "state": {"url": redis.url},
    }))  # fmt: skip
    with gateway(["--config", str(config)]) as a, gateway(["--config", str(config)]) as b:
        yield a, b


def until(read: Callable[[], float], expected: float, timeout_s: float = 5.0) -> float:
    """`read()` once it returns `expected`, or its last value after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (value := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


def test_each_gateway_sees_the_others_requests_and_counts_a_dead_one_out(
    worker: str, own_redis: RedisServer, tmp_path: Path
) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(json.dumps({
        "pools": [{"model": MODEL, "backends": [{"url": worker}]}],
        "state": {"ttl_s": 1.0},
    }))  # fmt: skip
    args = ["--config", str(config), "--state", own_redis.url]
    with gateway(args) as (a, proc_a), gateway(args) as (b, _):
        client = openai.OpenAI(base_url=a + "/v1", api_key="none", max_retries=0)
        streams = []
        for _ in range(STREAMS):  # held open: each has its first chunk, thousands to come
            stream = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "go on"}], max_tokens=4000,
                stream=True,
            )  # fmt: skip
            next(iter(stream))
            streams.append(stream)
        assert metric(a, IN_FLIGHT) == STREAMS
        # The other gateway sent none of them, and counts them all within a sync or two.
        assert until(lambda: metric(b, IN_FLIGHT), STREAMS) == STREAMS
        streams.pop().close()
        assert until(lambda: metric(b, IN_FLIGHT), STREAMS - 1) == STREAMS - 1
        proc_a.stop(signal.SIGKILL)  # dies with its requests in flight: no goodbye
        started = time.monotonic()
        assert until(lambda: metric(b, IN_FLIGHT), 0) == 0
        assert time.monotonic() - started < 3.0  # the 1 s lease, and a sync
        for stream in streams:
            stream.close()


def test_a_state_url_that_is_not_redis_is_refused_at_start() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleetgate", "serve", "--state", "http://cache:6379"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--state: give redis://host:port/db" in done.stderr


def chat(url: str, text: str) -> str:
    """A request's id, once answered."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    request = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(),
        {"content-type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        return str(response.headers["x-request-id"])


def backend_of(proc: Proc, request_id: str) -> str:
    """Where the request log says the request went (its lines are flushed within 0.2 s)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for line in proc.lines:
            if line.startswith("{") and f'"request_id":"{request_id}"' in line:
                return str(json.loads(line)["backend"])
        time.sleep(0.05)
    raise AssertionError(f"no request log line for {request_id}")


def test_a_prompt_sent_again_through_the_other_gateway_goes_where_it_went(
    four: list[str], own_redis: RedisServer, tmp_path: Path
) -> None:
    with two_gateways(four, own_redis, tmp_path) as ((a, proc_a), (b, proc_b)):
        firsts = {}
        for n in range(6):  # by chance alone, all six would go the same way 1 in 4^6
            text = f"conversation {n}: " + f"a long shared context {n} " * 80
            firsts[text] = backend_of(proc_a, chat(a, text))
        time.sleep(0.3)  # a few syncs
        for text, first in firsts.items():
            assert backend_of(proc_b, chat(b, text)) == first


def test_a_responses_follow_up_through_the_other_gateway_reaches_its_worker(
    four: list[str], own_redis: RedisServer, tmp_path: Path
) -> None:
    """Each sim worker keeps the responses it made and answers 404 for any other: a follow-up
    sent to the gateway that did not see its response made still reaches the right worker."""
    with two_gateways(four, own_redis, tmp_path) as ((a, _), (b, _)):
        made = [
            openai.OpenAI(base_url=a + "/v1", api_key="none").responses.create(
                model=MODEL, input=f"Hi {n}.", max_output_tokens=2
            )
            for n in range(4)
        ]
        time.sleep(0.3)  # a few syncs
        other = openai.OpenAI(base_url=b + "/v1", api_key="none", max_retries=0)
        for first in made:  # unpinned, three in four would 404
            later = other.responses.create(
                model=MODEL, input="And then?", max_output_tokens=2, previous_response_id=first.id
            )
            assert later.output_text


def test_redis_killed_mid_run_fails_no_request_and_sharing_comes_back(
    four: list[str], own_redis: RedisServer, tmp_path: Path
) -> None:
    up = "fleetgate_shared_state_up"
    with two_gateways(four, own_redis, tmp_path) as ((a, _), (b, _)):
        assert until(lambda: metric(a, up, part="prefix_index", model=MODEL), 1.0) == 1.0
        statuses = []
        for n in range(40):
            if n == 10:
                own_redis.kill()
            if n == 30:
                own_redis.start()
            for url in (a, b):
                try:
                    chat(url, f"request {n} " + "context " * 40)
                    statuses.append(200)
                except urllib.error.HTTPError as exc:
                    statuses.append(exc.code)
            if n == 20:
                assert metric(a, up, part="load_board", model=MODEL) == 0.0
                assert metric(a, "fleetgate_shared_state_sync_failures_total") > 0
        assert statuses == [200] * 80
        for url in (a, b):  # both share again, without a restart
            assert until(lambda url=url: metric(url, up, part="sessions", model=MODEL), 1.0) == 1.0
            assert (
                until(lambda url=url: metric(url, up, part="load_board", model=MODEL), 1.0) == 1.0
            )
        assert metric(b, "fleetgate_shared_state_heard_total", part="prefix_index") > 0


def test_two_gateways_together_admit_no_more_than_the_pools_limit(
    four: list[str], own_redis: RedisServer, tmp_path: Path
) -> None:
    limit = "fleetgate_admission_limit_requests"
    pool: dict[str, object] = {"admission": {"limit": {"max_in_flight": 4}}}
    with two_gateways(four, own_redis, tmp_path, pool) as ((a, _), (b, _)):
        for url in (a, b):  # each takes its share once it hears of the other
            assert until(lambda url=url: metric(url, limit), 2) == 2
        clients = [
            openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0) for url in (a, b)
        ]
        statuses, streams = [], []
        for n in range(8):
            try:
                stream = clients[n % 2].chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "go on"}],
                    max_tokens=4000, stream=True,
                    extra_headers={"x-fleetgate-queue-timeout-s": "0.3"},
                )  # fmt: skip
                next(iter(stream))
                streams.append(stream)
                statuses.append(200)
            except openai.APIStatusError as exc:
                statuses.append(exc.status_code)  # queue_timeout: its share is taken
        assert sorted(statuses) == [200] * 4 + [503] * 4  # 2 each: the pool's 4 in all
        for stream in streams:
            stream.close()
