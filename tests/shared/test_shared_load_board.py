"""The load board shared through Redis (shared/load_board.py), against a real redis-server:
each gateway's counts seen by the others after a sync, a gateway that leaves or dies counted
out, Redis going away and coming back without a request failing, and a pool on such a
board."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator

import pytest

from fleetgate.clock import LoopClock
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import BackendLoad, LoadBoard
from fleetgate.fleet.pool import Pool
from fleetgate.shared.load_board import SharedLoadBoard
from fleetgate.shared.state import RoutingState, StateSettings
from fleetgate.traffic.redis_store import redis_client
from tests.redis_server import RedisServer

NAMESPACE = "test:board:m"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def counts(load: BackendLoad) -> tuple[int, int, int]:
    return load.in_flight, load.in_flight_tokens, load.pending_prefill


async def boards_on(
    url: str, *ids: str, ttl_s: float = 2.0, clock: Clock | None = None
) -> AsyncIterator[list[SharedLoadBoard]]:
    client = redis_client(url)
    await client.flushdb()
    try:
        yield [
            SharedLoadBoard(
                client.execute_command, NAMESPACE, gateway_id, clock or Clock(), ttl_s=ttl_s
            )
            for gateway_id in ids
        ]
    finally:
        await client.aclose()


@pytest.fixture
async def two(redis: RedisServer) -> AsyncIterator[list[SharedLoadBoard]]:
    async for boards in boards_on(redis.url, "gw-a", "gw-b"):
        yield boards


async def test_each_gateway_sees_the_others_counts_once_both_have_synced(
    two: list[SharedLoadBoard],
) -> None:
    a, b = two
    a.begin("b1", 100)
    a.begin("b1", 100)
    b.begin("b1", 50)
    b.begin("b2", 10)
    held = a.load("b1")
    assert counts(held) == (2, 200, 200)  # its own at once, with no I/O
    assert not a.shared  # not synced yet
    assert await a.sync() and await b.sync() and await a.sync()
    assert a.shared and b.shared
    assert a.load("b1") is held  # the same record, current in place
    assert counts(held) == (3, 250, 250)
    assert counts(a.own("b1")) == (2, 200, 200)
    assert counts(a.load("b2")) == (1, 10, 10)
    assert counts(b.load("b1")) == (3, 250, 250)
    a.prefilled("b1", 100)
    a.end("b1", 100, 0)
    assert counts(held) == (2, 150, 150)  # one of its own prefilled, the other ended
    await a.sync()
    await b.sync()
    assert counts(b.load("b1")) == (2, 150, 150)
    b.end("b1", 50, 50)
    b.end("b2", 10, 10)
    await b.sync()
    await a.sync()
    assert counts(held) == (1, 100, 100)  # b's lease no longer names b1: nothing of it left
    assert counts(a.load("b2")) == (0, 0, 0)


async def test_a_gateway_that_leaves_is_counted_out_at_once_one_that_dies_after_its_ttl(
    redis: RedisServer,
) -> None:
    async for boards in boards_on(redis.url, "stays", "leaves", "dies", ttl_s=0.3):
        stays, leaves, dies = boards
        leaves.begin("b1", 1)
        dies.begin("b1", 1)
        await leaves.sync()
        await dies.sync()
        await stays.sync()
        assert stays.load("b1").in_flight == 2
        await leaves.leave()
        await stays.sync()
        assert stays.load("b1").in_flight == 1  # left: gone at the next sync
        await asyncio.sleep(0.4)  # Redis's own clock lapses the dead one's lease
        await stays.sync()
        assert stays.load("b1").in_flight == 0


async def test_a_lease_that_does_not_read_as_counts_is_skipped(
    two: list[SharedLoadBoard], redis: RedisServer
) -> None:
    a, b = two
    b.begin("b1", 5)
    await b.sync()
    client = redis_client(redis.url)
    try:
        bad = {"b2": "x y z", "b3": "1 2", b"\xff": "1 1 1"}
        await client.hset(f"{NAMESPACE}:lease:gw-b", mapping=bad)  # type: ignore[arg-type]
    finally:
        await client.aclose()
    assert await a.sync()
    assert counts(a.load("b1")) == (1, 5, 5)
    assert counts(a.load("b2")) == (0, 0, 0)


async def test_redis_away_never_fails_the_board_falls_back_to_its_own_then_converges(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    async for boards in boards_on(own_redis.url, "gw-a", "gw-b", ttl_s=1.0, clock=clock):
        a, b = boards
        a.begin("b1", 10)
        b.begin("b1", 20)
        await b.sync()
        await a.sync()
        assert counts(a.load("b1")) == (2, 30, 30)
        own_redis.kill()
        with caplog.at_level(logging.WARNING, logger="fleetgate.shared.load_board"):
            assert not await a.sync()
            assert counts(a.load("b1")) == (2, 30, 30)  # what it heard is younger than a lease
            a.begin("b1", 1)  # the request path goes on, in memory
            clock.now += 1.0
            assert not await a.sync()
            assert counts(a.load("b1")) == (2, 11, 11)  # its own alone
            assert not a.shared and a.failures == 2
            warned = [r.getMessage() for r in caplog.records]
            assert len(warned) == 1 and "Redis did not answer" in warned[0]  # once an outage
            own_redis.start()
            assert await b.sync() and await a.sync()
            assert a.shared
            assert counts(a.load("b1")) == (3, 31, 31)
            assert "shared again" in caplog.records[-1].getMessage()


def test_it_keeps_the_load_board_promises_before_any_sync() -> None:
    async def unreachable(*args: object) -> None:
        raise AssertionError("no I/O on the request path")

    board: LoadBoard = SharedLoadBoard(unreachable, NAMESPACE, "solo", Clock())
    after = board.begin("10.0.0.1:8000", 500)
    board.begin("10.0.0.1:8000", 300)
    load = board.load("10.0.0.1:8000")
    assert after is load
    assert counts(load) == (2, 800, 800)
    board.prefilled("10.0.0.1:8000", 500)
    assert board.end("10.0.0.1:8000", 300, 300) is load
    assert counts(load) == (1, 500, 0)
    assert board.loads(["x", "10.0.0.1:8000"]) == [board.load("x"), load]
    board.forget("10.0.0.1:8000")
    board.forget("never there")
    assert counts(board.load("10.0.0.1:8000")) == (0, 0, 0)


async def test_a_pool_on_a_shared_board_sees_a_backend_filled_by_another_gateway(
    two: list[SharedLoadBoard],
) -> None:
    here, there = two
    states = [
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{9200 + i}", ("m",), max_in_flight=2))
        for i in (0, 1)
    ]
    pool = Pool("m", states, board=here)
    changed: list[str] = []
    pool.load_changed = lambda state: changed.append(state.backend.id)
    there.begin("b0", 1)
    there.begin("b0", 1)  # b0 full, through the other gateway alone
    await there.sync()
    await here.sync()
    assert changed == ["b0"]  # a picker keeping an index is told
    assert pool.candidates == (states[1],)
    there.end("b0", 1, 1)
    await there.sync()
    await here.sync()
    assert set(pool.candidates) == set(states)


async def test_a_retired_backend_leaves_once_this_gateways_requests_end(
    two: list[SharedLoadBoard],
) -> None:
    here, there = two
    state = BackendState(Backend("b0", "http://127.0.0.1:9300", ("m",)))
    pool = Pool("m", [state], board=here)
    there.begin("b0", 1)  # another gateway's request: its own to finish
    await there.sync()
    await here.sync()
    pool.begin("b0", 0.0, prompt_tokens=5)
    assert not pool.retire(state, 1.0)
    pool.end("b0", 2.0, prompt_tokens=5, unprefilled=5)
    assert pool.members == {}


async def test_it_counts_the_gateways_on_it_and_is_alone_once_redis_is_long_gone(
    own_redis: RedisServer,
) -> None:
    clock = Clock()
    async for boards in boards_on(own_redis.url, "gw-a", "gw-b", "gw-c", ttl_s=1.0, clock=clock):
        a, b, c = boards
        assert a.gateways == 1  # alone until it hears otherwise
        for board in (a, b, c, a):
            await board.sync()
        assert a.gateways == 3
        await c.leave()
        await a.sync()
        assert a.gateways == 2
        own_redis.kill()
        await a.sync()
        assert a.gateways == 2  # what it heard is younger than a lease
        clock.now += 1.0
        await a.sync()
        assert a.gateways == 1


async def test_a_part_that_fails_oddly_is_logged_once_and_the_others_sync_on(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    state = RoutingState(StateSettings(url=redis.url), LoopClock(), random.Random(0))
    board = state.load_board("m")
    board.begin("b1", 1)

    class Broken:
        async def sync(self) -> bool:
            raise ValueError("a reply no part expects")

    state._synced.append(("prefix_index", "m", Broken()))  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.ERROR, logger="fleetgate.shared.state"):
            for _ in range(3):
                await state.sync()
        assert len(caplog.records) == 1 and "syncing the shared state failed" in caplog.text
        assert board.shared  # type: ignore[attr-defined]
    finally:
        await state.close()
