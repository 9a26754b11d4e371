"""The Redis registry against a real redis-server: a worker's heartbeat keeps its entry, a
clean stop takes it out at once, a dead worker's lapses; a bad entry is skipped, Redis away
is a SourceError (its last good set is kept by the reconciler)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
import pytest

from fleetgate.discovery.found import Found, SourceError
from fleetgate.discovery.registry import RedisRegistry, Registration, entry_key, workers_key
from fleetgate.traffic.redis_store import redis_client
from tests.redis_server import RedisServer

PREFIX = "fg-test"


async def registered(registry: RedisRegistry) -> None:
    """Wait (up to 5 s) until one worker is registered."""
    for _ in range(100):
        with contextlib.suppress(SourceError):
            if len(await registry.read()) == 1:
                return
        await asyncio.sleep(0.05)
    raise AssertionError("no worker registered within 5 s")


def registration(url: str, port: int, interval_s: float = 1.0) -> Registration:
    entry = Found(model="m", url=f"http://127.0.0.1:{port}", labels={"zone": "a"})
    return Registration(redis_client(url), PREFIX, f"127.0.0.1:{port}", entry, interval_s)


async def test_registered_workers_are_read_and_a_clean_stop_leaves_at_once(
    redis: RedisServer, client: Any
) -> None:
    registry = RedisRegistry(redis.url, PREFIX, 0.5)
    where = f"127.0.0.1:{redis.port}/0"
    assert registry.name == f"redis:{where}:{PREFIX}" and await registry.read() == []
    secret = RedisRegistry(f"redis://:hunter2@127.0.0.1:{redis.port}/3", PREFIX, 0.5)
    assert secret.name == f"redis:127.0.0.1:{redis.port}/3:{PREFIX}"  # never the password
    await secret.close()
    one, two = registration(redis.url, 9001), registration(redis.url, 9002)
    await one.beat()
    await two.beat()
    found = await registry.read()
    assert [f.url for f in found] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert found[0].labels == {"zone": "a"}
    await one.leave()
    assert [f.url for f in await registry.read()] == ["http://127.0.0.1:9002"]
    for r in (one, two, registry):
        await r.close()


async def test_a_worker_whose_heartbeats_stop_lapses_and_is_dropped_from_the_set(
    redis: RedisServer, client: Any
) -> None:
    registry = RedisRegistry(redis.url, PREFIX, 0.5)
    dying = registration(redis.url, 9003, interval_s=0.25)  # its entry lives 3 beats: 0.75 s
    beating = asyncio.get_running_loop().create_task(dying.run())
    await asyncio.sleep(1.0)  # alive past one entry's life: the beats renew it
    assert len(await registry.read()) == 1
    beating.cancel()  # killed: no clean stop
    await asyncio.sleep(0.9)
    assert await registry.read() == []
    assert await client.smembers(workers_key(PREFIX)) == set()
    await dying.close()
    await registry.close()


@pytest.mark.parametrize(
    "entry",
    [b"not json", b'{"model": "m"}', b'{"model": "m", "url": "ftp://x"}',
     b'{"model": "m", "url": "http://x:80", "weight": -1}',
     msgspec.json.encode({"model": "m", "url": "http://x:80", "labels": {"k": "v" * 70_000}})],
)  # fmt: skip
async def test_an_entry_it_cannot_use_is_skipped_and_the_rest_read(
    redis: RedisServer, client: Any, entry: bytes
) -> None:
    await client.set(entry_key(PREFIX, "bad"), entry)
    await client.sadd(workers_key(PREFIX), "bad")
    good = registration(redis.url, 9004)
    await good.beat()
    registry = RedisRegistry(redis.url, PREFIX, 0.5)
    assert [f.url for f in await registry.read()] == ["http://127.0.0.1:9004"]
    await good.close()
    await registry.close()


async def test_redis_away_is_a_source_error_and_the_worker_keeps_trying(
    own_redis: RedisServer,
) -> None:
    registry = RedisRegistry(own_redis.url, PREFIX, 0.5)
    worker = registration(own_redis.url, 9005, interval_s=0.1)
    beating = asyncio.get_running_loop().create_task(worker.run())
    await registered(registry)
    own_redis.kill()
    with pytest.raises(SourceError, match=f"redis:127.0.0.1:{own_redis.port}/0:{PREFIX}: "):
        await registry.read()
    own_redis.start()  # empty: the worker registers again at its next beat
    await registered(registry)
    beating.cancel()
    await worker.close()
    await registry.close()
