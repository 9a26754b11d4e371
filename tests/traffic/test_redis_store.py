"""What the Redis store adds to the spec it shares with the in-process store (test_store.py):
gateways share its buckets, atomically and on Redis's clock; its keys expire; and when Redis
dies or hangs, requests are still answered, from this gateway's share of each limit."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from fleetgate.clock import LoopClock
from fleetgate.traffic.instances import InstanceCount
from fleetgate.traffic.redis_store import _SHA, _TAKE, RedisStore, redis_client
from fleetgate.traffic.store import Bucket
from tests.redis_server import RedisServer, redis_server
from tests.traffic.conftest import Clock, flush, redis_store

LOGGER = "fleetgate.traffic.redis_store"


@pytest.fixture
async def url(redis: RedisServer) -> str:
    await flush(redis.url)
    return redis.url


@pytest.fixture
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of the test's own, to kill, hang and restart."""
    with redis_server(tmp_path_factory.mktemp("own-redis")) as server:
        yield server


@pytest.fixture
async def peek(url: str) -> AsyncIterator[aioredis.Redis]:
    client = redis_client(url)
    yield client
    await client.aclose()


async def test_two_gateways_take_from_one_bucket(url: str) -> None:
    a, b = await redis_store(url), await redis_store(url)
    rpm = Bucket("t:rpm", 3, 0.01)
    for _ in range(3):
        assert (await a.take([rpm], [1])).ok
    refused = await b.take([rpm], [1])
    assert not refused.ok
    assert refused.levels == [pytest.approx(0, abs=0.01)]
    await b.give([rpm], [2])  # what one gateway gives back, the other can take
    assert (await a.take([rpm], [2])).ok
    await a.close()
    await b.close()


async def test_gateways_taking_at_once_never_take_more_than_the_bucket_holds(url: str) -> None:
    stores = [await redis_store(url) for _ in range(4)]
    rpm, tpm = Bucket("t:rpm", 1000, 1e-6), Bucket("t:tpm", 400, 1e-6)
    takes = [s.take([rpm, tpm], [1, 10]) for _ in range(30) for s in stores]
    taken = await asyncio.gather(*takes)
    assert sum(t.ok for t in taken) == 40  # 400 tokens / 10 each, of 120 tries
    both = await stores[0].take([rpm, tpm], [0, 0])
    assert both.levels == [pytest.approx(960, abs=0.01), pytest.approx(0, abs=0.01)]
    for store in stores:
        await store.close()


async def test_the_gateways_clocks_play_no_part(url: str) -> None:
    """Gateways whose clocks are an hour apart (and stopped) still refill a bucket by Redis's
    clock: a refusal's wait is what the rate says, for both."""
    early = await redis_store(url, Clock(0.0))
    late = await redis_store(url, Clock(3600.0))
    rpm = Bucket("t:rpm", 2, 4.0)
    assert (await early.take([rpm], [2])).ok
    for store in (early, late):
        refused = await store.take([rpm], [1])
        assert not refused.ok and refused.wait_s == pytest.approx(0.25, abs=0.1)
    await asyncio.sleep(0.3)
    assert (await late.take([rpm], [1])).ok
    await early.close()
    await late.close()


async def test_a_bucket_is_kept_until_full_again_then_vanishes(
    url: str,
    peek: redis_client,  # type: ignore[valid-type]
) -> None:
    store = await redis_store(url)
    rpm = Bucket("t:rpm", 4, 2.0)
    await store.take([rpm], [1])
    assert 400 <= await peek.pttl(rpm.key) <= 500  # (4 - 3) / 2 s
    await store.take([rpm], [3])
    assert 1900 <= await peek.pttl(rpm.key) <= 2000
    await store.give([rpm], [4])  # full: nothing to remember
    assert not await peek.exists(rpm.key)
    budget = Bucket("b:acme:day:20000", 100, 0.0, ttl_s=90.0)
    await store.take([budget], [1])
    assert 89_000 <= await peek.pttl(budget.key) <= 90_000
    fast = Bucket("t:fast", 1, 10.0)
    await store.take([fast], [1])
    await asyncio.sleep(0.15)  # full again after 0.1 s
    assert not await peek.exists(fast.key)
    await store.close()


async def test_a_redis_that_forgot_the_scripts_gets_them_again(
    url: str,
    peek: redis_client,  # type: ignore[valid-type]
) -> None:
    store = await redis_store(url)
    await peek.script_flush()
    assert (await store.take([Bucket("t:rpm", 3, 1.0)], [1])).ok
    assert await peek.script_exists(_SHA[_TAKE]) == [True]
    assert store.shared
    await store.close()


async def test_a_hung_redis_holds_a_request_no_longer_than_the_timeout(
    own_redis: RedisServer,
) -> None:
    store = await redis_store(own_redis.url)
    rpm = Bucket("t:rpm", 3, 1.0)
    assert (await store.take([rpm], [1])).ok  # connected
    own_redis.pause()
    try:
        started = time.monotonic()
        assert (await store.take([rpm], [1])).ok  # from the fallback
        # The timeout (TIMEOUT_S) and some scheduling: never a client's whole wait.
        assert time.monotonic() - started < 0.5
        assert not store.shared
    finally:
        own_redis.resume()
    await store.close()


async def test_without_redis_each_gateway_takes_its_share_and_says_so_once(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    client, other = redis_client(own_redis.url), redis_client(own_redis.url)
    mine = InstanceCount(client, "test", "mine", random.Random(1), LoopClock())
    theirs = InstanceCount(other, "test", "theirs", random.Random(2), LoopClock())
    for count in (mine, theirs, mine):
        await count.beat()
    assert mine.count == 2
    store = RedisStore(client, mine, clock, backoff_s=1.0)
    rpm = Bucket("test:t:acme:rpm", 10, 1e-6)
    assert (await store.take([rpm], [1])).ok  # from Redis: 9 left there
    caplog.set_level(logging.WARNING, LOGGER)

    own_redis.kill()
    taken = [await store.take([rpm], [1]) for _ in range(8)]
    assert [t.ok for t in taken] == [True] * 5 + [False] * 3  # its share: 10 / 2 gateways
    assert taken[-1].levels == [pytest.approx(0, abs=0.01)]
    await store.give([rpm], [1])  # a reservation reconciled during the outage
    assert (await store.take([rpm], [1])).ok
    clock.now += 1.0  # Redis is tried again, fails again: the same outage, no new warning
    assert not (await store.take([rpm], [1])).ok
    failed = [r for r in caplog.records if "Redis failed" in r.getMessage()]
    assert len(failed) == 1 and "ConnectionError" in failed[0].getMessage()
    assert "1/2" in failed[0].getMessage()
    await mine.beat()  # a heartbeat without Redis keeps the count it had
    assert mine.count == 2

    own_redis.start()  # back, empty; not asked again before the backoff is over
    assert not (await store.take([rpm], [1])).ok
    peek = redis_client(own_redis.url)
    assert not await peek.exists(rpm.key)
    clock.now += 1.0
    assert (await store.take([rpm], [1])).levels == [pytest.approx(9, abs=0.01)]  # in Redis
    assert await peek.exists(rpm.key)
    assert store.shared
    back = [r for r in caplog.records if "Redis answers again after" in r.getMessage()]
    assert len(back) == 1
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
    await peek.aclose()
    await other.aclose()
    await store.close()


@pytest.mark.parametrize(
    "error",
    [asyncio.IncompleteReadError(b"*2\r\n", 64), RuntimeError("reader torn down"), EOFError()],
)
async def test_a_reply_cut_off_as_redis_dies_falls_back_too(url: str, error: Exception) -> None:
    """What the client's parser lets through when Redis dies mid-reply is a failure of Redis,
    not of the request."""
    store = await redis_store(url)
    rpm = Bucket("t:rpm", 3, 1.0)

    async def cut_off(*args: object) -> object:
        raise error

    store._execute = cut_off
    assert (await store.take([rpm], [1])).ok  # from this gateway's share
    assert not store.shared
    await store.give([rpm], [1])
    await store.close()
