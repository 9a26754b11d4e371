"""The prefix index shared through Redis (shared/prefix_index.py), against a real redis-server:
one gateway's decisions recorded by the others after a sync, a gateway that starts later
beginning warm, and Redis going away without a decision lost (up to the queue's bound)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from fleetgate.routing.prefix_index import LAYOUT, MemoryPrefixIndex
from fleetgate.shared.prefix_index import SharedPrefixIndex
from fleetgate.traffic.redis_store import redis_client
from tests.redis_server import RedisServer

NAMESPACE = "test:prefix:m"
PROMPT = [11, 22, 33, 44]


def index_on(client: Any, gateway_id: str, **kwargs: int) -> SharedPrefixIndex:
    return SharedPrefixIndex(
        MemoryPrefixIndex(10_000), client.execute_command, NAMESPACE, gateway_id, **kwargs
    )


async def test_each_gateway_records_the_others_decisions_after_a_sync(client: Any) -> None:
    a, b = index_on(client, "gw-a"), index_on(client, "gw-b")
    a.record("b1", PROMPT)
    b.record("b2", PROMPT[:2])
    assert a.matches(PROMPT) == {"b1": 4}  # its own at once, with no I/O
    assert await a.sync() and await b.sync() and await a.sync()
    assert a.matches(PROMPT) == {"b1": 4, "b2": 2}
    assert b.matches(PROMPT) == {"b1": 4, "b2": 2}
    assert b.deepest(PROMPT, 1) == ["b1"]
    assert (a.stream.heard, b.stream.heard) == (1, 1)  # never its own back


async def test_a_gateway_that_starts_later_begins_warm(client: Any) -> None:
    early = index_on(client, "early")
    for n in range(5):
        early.record(f"b{n}", [100 + n, 200 + n])
        await early.sync()
    late = index_on(client, "late")
    assert await late.sync()
    assert late.matches([103, 203]) == {"b3": 2}
    assert late.stream.heard == 5


async def test_an_entry_that_does_not_decode_is_skipped(client: Any) -> None:
    a, b = index_on(client, "gw-a"), index_on(client, "gw-b")
    await client.xadd(f"{NAMESPACE}:decisions:v{LAYOUT}", {"g": "gw-x", "r": b"\xc1 not msgpack"})
    await client.xadd(f"{NAMESPACE}:decisions:v{LAYOUT}", {"g": "gw-x"})
    a.record("b1", PROMPT)
    await a.sync()
    assert await b.sync()
    assert b.stream.undecodable == 2
    assert b.matches(PROMPT) == {"b1": 4}


async def test_a_decision_made_while_it_publishes_goes_with_the_next_sync(client: Any) -> None:
    a, b = index_on(client, "gw-a"), index_on(client, "gw-b")
    execute = client.execute_command

    async def meanwhile(*args: Any) -> Any:
        if args[0] == "XADD":
            a.record("b9", [9, 99])  # routed while the first batch is on its way
        return await execute(*args)

    a.stream._execute = meanwhile  # type: ignore[attr-defined]
    a.record("b1", PROMPT)
    await a.sync()
    a.stream._execute = execute  # type: ignore[attr-defined]
    await a.sync()
    await b.sync()
    assert b.matches(PROMPT) == {"b1": 4}
    assert b.matches([9, 99]) == {"b9": 2}


async def test_redis_away_queues_decisions_up_to_a_bound_then_publishes_them(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    c = redis_client(own_redis.url)
    try:
        a, b = index_on(c, "gw-a", max_queued=2), index_on(c, "gw-b")
        assert await a.sync()
        own_redis.kill()
        with caplog.at_level(logging.WARNING, logger="fleetgate.shared.stream"):
            a.record("b1", [1, 2])
            assert not await a.sync()
            a.record("b2", [3, 4])
            a.record("b3", [5, 6])
            assert not await a.sync()
            assert a.matches([1, 2]) == {"b1": 2}  # the local index never stopped
            assert (a.stream.failures, a.stream.dropped) == (2, 1)  # the oldest beyond the bound
            assert len(caplog.records) == 1
            own_redis.start()  # empty: what b reads now is what a publishes next
            assert await a.sync() and await b.sync()
            assert "shared again" in caplog.records[-1].getMessage()
        assert b.matches([1, 2]) == {}
        assert b.matches([3, 4]) == {"b2": 2} and b.matches([5, 6]) == {"b3": 2}
    finally:
        await c.aclose()
