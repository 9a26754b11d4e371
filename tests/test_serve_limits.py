"""The composition root's part in shared limits: a gateway configured with `limits.store: redis`
registers itself in Redis while it runs, and leaves (its heartbeat stopped, its client closed)
when it stops."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetgate.config import parse_config
from fleetgate.running import start_gateway
from fleetgate.traffic.redis_store import redis_client
from tests.redis_server import RedisServer, redis_server


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path / "redis") as server:
        yield server


@pytest.mark.parametrize("stop", ["close", "drain"])
async def test_a_gateway_on_redis_is_counted_while_it_runs(redis: RedisServer, stop: str) -> None:
    config = parse_config({
        "server": {"port": 0},
        "tenants": [{"name": "t", "keys": ["sk-serve-limits-key"],
                     "limits": {"requests_per_minute": 60}}],
        "pools": [{"model": "m", "health_check": {"enabled": False},
                   "engine_metrics": {"enabled": False},
                   "backends": [{"url": "http://127.0.0.1:9"}]}],
        "limits": {"store": "redis", "redis_url": redis.url, "key_prefix": "serve"},
    })  # fmt: skip
    peek = redis_client(redis.url)
    running = await start_gateway(config)
    async with asyncio.timeout(5):  # its first heartbeat is a task of its own: wait for it
        while await peek.zcard("serve:instances") == 0:
            pass  # each ask is a round trip to Redis, in which the heartbeat task runs
    assert await peek.zcard("serve:instances") == 1
    if stop == "close":
        await running.close()
    else:
        await running.drain(0.1)
    assert await peek.zcard("serve:instances") == 0
    await peek.aclose()
