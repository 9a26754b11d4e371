"""The limit stores under one spec (tests/traffic/test_store.py): the in-process store on a
fake clock, and the Redis store against a real redis-server on Redis's real clock."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from fleetgate.clock import LoopClock
from fleetgate.traffic.instances import InstanceCount
from fleetgate.traffic.redis_store import RedisStore, redis_client
from fleetgate.traffic.store import LimitStore, MemoryStore
from tests.redis_server import RedisServer


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    async def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Subject:
    """A store, how to let time pass for it, and how far apart in time two of its calls may
    be when no time was meant to pass (0 on a fake clock; a real clock keeps moving)."""

    store: LimitStore
    advance: Callable[[float], Awaitable[None]]
    slack_s: float

    def about(self, expected: float, rate_per_s: float = 1.0) -> Any:
        """`expected`, give or take what `slack_s` of refill at `rate_per_s` adds."""
        return pytest.approx(expected, abs=rate_per_s * self.slack_s + 1e-9)


async def redis_store(url: str, clock: Callable[[], float] = time.monotonic) -> RedisStore:
    client = redis_client(url)
    return RedisStore(
        client, InstanceCount(client, "test", "solo", random.Random(0), LoopClock()), clock
    )


@pytest.fixture(params=["memory", "redis"])
async def subject(request: pytest.FixtureRequest) -> AsyncIterator[Subject]:
    if request.param == "memory":
        clock = Clock()
        yield Subject(MemoryStore(clock), clock.advance, 0.0)
        return
    server: RedisServer = request.getfixturevalue("redis")  # only when a test needs it
    await flush(server.url)
    store = await redis_store(server.url)
    # 0.1 s: a call on a busy 2-core machine may be that late; bucket rates in the spec keep
    # rate * slack under half a unit, so an off-by-one still fails.
    yield Subject(store, asyncio.sleep, 0.1)
    assert store.shared, "Redis failed during the test: it fell back to memory"
    await store.close()


async def flush(url: str) -> None:
    """Empty the test Redis, so that no test sees another's buckets."""
    client = redis_client(url)
    await client.flushdb()
    await client.aclose()
