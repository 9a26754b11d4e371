"""The lease among gateways (shared/lease.py) on a real Redis: one holder at a time, kept by
renewing, handed on at once by a release; and a holder that cannot reach Redis counts itself
out before Redis would let another take the lease."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from fleetgate.clock import LoopClock
from fleetgate.shared.lease import Lease

T = TypeVar("T")
KEY = "test:lease"


class HandClock:
    """A clock moved by hand (its waits are the loop's)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)

    async def within(self, aw: Awaitable[T], seconds: float) -> T:
        return await aw

    def call_later(self, seconds: float, callback: Any) -> asyncio.TimerHandle:
        raise NotImplementedError


async def test_one_holder_at_a_time_until_it_releases(client: Any) -> None:
    a = Lease(client.execute_command, KEY, "a", LoopClock(), ttl_s=2.0)
    b = Lease(client.execute_command, KEY, "b", LoopClock(), ttl_s=2.0)
    assert await a.renew()
    assert not await b.renew()
    assert await a.renew()  # kept
    assert 1500 < await client.pttl(KEY) <= 2000
    assert not await b.renew() and not b.held()
    await a.release()
    assert not a.held()
    assert await b.renew()  # at once: no waiting for a's time to run out
    assert not await a.renew()


async def test_a_release_by_one_not_holding_leaves_the_holder_be(client: Any) -> None:
    a = Lease(client.execute_command, KEY, "a", LoopClock(), ttl_s=2.0)
    b = Lease(client.execute_command, KEY, "b", LoopClock(), ttl_s=2.0)
    assert await a.renew()
    await b.release()
    assert await client.get(KEY) == b"a"


async def test_a_holder_cut_off_from_redis_lets_go_before_redis_frees_the_lease(
    client: Any,
) -> None:
    clock = HandClock()
    reachable = True

    async def execute(*command: Any) -> Any:
        if not reachable:
            raise RedisConnectionError("Redis is away")
        return await client.execute_command(*command)

    a = Lease(execute, KEY, "a", clock, ttl_s=2.0, budget_s=0.5)
    assert await a.renew()
    assert a.until == pytest.approx(1.5)  # sent at 0, less the budget
    reachable = False
    clock.t = 0.9
    assert await a.renew() and a.failures == 1  # failed early: the next can still land
    clock.t = 1.0
    assert not await a.renew()  # the next could land after the hold: given up now
    assert a.until == float("-inf")
    # Redis counts the 2 s from when it got the renewal (at 0, or later): the lease is still
    # a's there, so no other gateway could have it while a still thought it did.
    assert await client.get(KEY) == b"a"
    reachable = True
    assert await a.renew()  # Redis back: its own lease, renewed


def test_a_lease_too_short_for_its_budget_is_refused() -> None:
    async def execute(*command: Any) -> Any:
        return None

    with pytest.raises(ValueError, match="cannot be renewed"):
        Lease(execute, KEY, "a", LoopClock(), ttl_s=1.0, budget_s=0.5)
