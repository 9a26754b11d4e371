"""Counting the gateways that share a Redis: registered by heartbeat, gone when they stop or
when their heartbeats lapse."""

from __future__ import annotations

import asyncio
import random
import time

import redis.asyncio as aioredis

from fleetgate.clock import LoopClock
from fleetgate.traffic.instances import InstanceCount
from fleetgate.traffic.redis_store import redis_client
from tests.redis_server import RedisServer
from tests.traffic.conftest import flush


def count(client: aioredis.Redis, name: str, ttl_s: float = 6.0) -> InstanceCount:
    return InstanceCount(
        client, "test", name, random.Random(name), LoopClock(), interval_s=0.05, ttl_s=ttl_s
    )


async def test_gateways_count_each_other_and_leave_when_they_stop(redis: RedisServer) -> None:
    await flush(redis.url)
    client = redis_client(redis.url)
    a, b, c = count(client, "a"), count(client, "b"), count(client, "c")
    assert a.count == 1  # before any heartbeat: alone, the safe guess
    for gateway in (a, b, c, a):
        await gateway.beat()
    assert (a.count, b.count, c.count) == (3, 2, 3)
    await b.stop()
    await a.beat()
    assert a.count == 2
    await client.aclose()


async def test_a_gateway_that_dies_is_counted_out_after_its_ttl(redis: RedisServer) -> None:
    await flush(redis.url)
    client = redis_client(redis.url)
    alive, dead = count(client, "alive", ttl_s=0.3), count(client, "dead", ttl_s=0.3)
    await dead.beat()  # and never again, nor stops
    await alive.beat()
    assert alive.count == 2
    await asyncio.sleep(0.2)
    await alive.beat()  # keeps the set alive, past the dead one's lapse
    assert alive.count == 2
    await asyncio.sleep(0.2)
    await alive.beat()
    assert alive.count == 1
    await client.aclose()


async def test_started_it_keeps_beating_until_stopped(redis: RedisServer) -> None:
    await flush(redis.url)
    client = redis_client(redis.url)
    gateway, watcher = count(client, "started", ttl_s=0.3), count(client, "watcher")
    gateway.start()
    deadline = time.monotonic() + 5
    while watcher.count < 2 and time.monotonic() < deadline:  # its first beat is at once
        await watcher.beat()
    await asyncio.sleep(0.5)  # longer than its ttl: only beating keeps it counted
    await watcher.beat()
    assert watcher.count == 2
    await gateway.stop()
    await watcher.beat()
    assert watcher.count == 1
    await client.aclose()
