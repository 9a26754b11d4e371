"""What the shared-state tests share: a client of the session's redis-server, on an empty
database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetgate.traffic.redis_store import redis_client
from tests.redis_server import RedisServer


@pytest.fixture
async def client(redis: RedisServer) -> AsyncIterator[Any]:
    c = redis_client(redis.url)
    await c.flushdb()
    yield c
    await c.aclose()
