"""The response cache end to end: a real gateway (`cache.enabled`) before a real sim worker,
asked through the official openai SDK: a deterministic request asked again is answered from
the cache, whole or as a stream; identical requests at once reach the worker once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from tests.e2e.procs import Proc, gateway, metric, sim_workers
from tests.redis_server import redis_server

MODEL = "cached-8b"
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 + 2?"}],
       "max_tokens": 8, "temperature": 0}  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Proc]]:
    with sim_workers(MODEL, 1) as urls:
        config = tmp_path_factory.mktemp("cache") / "gw.yaml"
        config.write_text(json.dumps({
            "pools": [{"model": MODEL, "backends": [{"url": urls[0]}]}],
            "cache": {"enabled": True},
        }))  # fmt: skip
        with gateway(["--config", str(config)]) as (url, proc):
            yield url, urls[0], proc


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def served(worker: str) -> float:
    return metric(worker, "vllm:request_success_total")


def test_a_deterministic_request_asked_again_is_answered_from_the_cache(
    fleet: tuple[str, str, Proc],
) -> None:
    url, worker, proc = fleet
    first = client(url).chat.completions.with_raw_response.create(**ASK)  # type: ignore[call-overload]
    before = served(worker)
    again = client(url).chat.completions.with_raw_response.create(**ASK)  # type: ignore[call-overload]
    assert first.headers["x-fleetgate-cache"] == "miss"
    assert again.headers["x-fleetgate-cache"] == "hit"
    assert again.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert served(worker) == before  # the worker was not asked
    proc.wait_for(r'"cache":"(hit)"')  # the request log says so
    stream = client(url).chat.completions.create(**ASK, stream=True)  # type: ignore[call-overload]
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == first.parse().choices[0].message.content and served(worker) == before
    assert metric(url, "fleetgate_cache_requests_total", result="hit") == 2


def test_identical_requests_at_once_reach_the_worker_once(fleet: tuple[str, str, Proc]) -> None:
    url, worker, _ = fleet
    ask = {**ASK, "seed": 31, "temperature": 0.8}  # a seed fixes the answer too
    before = served(worker)
    with ThreadPoolExecutor(30) as pool:
        answers = list(pool.map(lambda _: client(url).chat.completions.create(**ask), range(30)))
    assert len({a.choices[0].message.content for a in answers}) == 1
    assert served(worker) == before + 1


def test_a_request_that_does_not_fix_its_answer_is_never_served_again(
    fleet: tuple[str, str, Proc],
) -> None:
    url, worker, _ = fleet
    ask = {**ASK, "temperature": 0.7}
    before = served(worker)
    for _ in range(2):
        raw = client(url).chat.completions.with_raw_response.create(**ask)
        assert "x-fleetgate-cache" not in raw.headers
    assert served(worker) == before + 2


def test_two_gateways_on_one_redis_share_answers_and_coalesce_across(tmp_path: Path) -> None:
    with sim_workers(MODEL, 1) as urls, redis_server(tmp_path / "redis") as redis:
        config = tmp_path / "gw.yaml"
        config.write_text(json.dumps({
            "pools": [{"model": MODEL, "backends": [{"url": urls[0]}]}],
            "state": {"url": redis.url}, "cache": {"enabled": True, "store": "redis"},
        }))  # fmt: skip
        with (
            gateway(["--config", str(config)]) as (a, _),
            gateway(["--config", str(config)]) as (
                b,
                _,
            ),
        ):
            asked = client(a).chat.completions.with_raw_response.create(**ASK)  # type: ignore[call-overload]
            again = client(b).chat.completions.with_raw_response.create(**ASK)  # type: ignore[call-overload]
            assert (asked.headers["x-fleetgate-cache"], again.headers["x-fleetgate-cache"]) == (
                "miss",
                "hit",
            )  # asked of the other gateway, kept in Redis
            ask = {**ASK, "seed": 5, "temperature": 1.0}
            before = served(urls[0])
            with ThreadPoolExecutor(20) as pool:
                answers = list(pool.map(
                    lambda n: client((a, b)[n % 2]).chat.completions.create(**ask), range(100)
                ))  # fmt: skip
            assert len({x.choices[0].message.content for x in answers}) == 1
            assert served(urls[0]) == before + 1  # 100 at once, over two gateways: one
