"""Admission when a pool is saturated: who waits, who goes first, who is shed, and when."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import msgspec
import pytest

from fleetgate.clock import LoopClock
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.pool import Pool
from fleetgate.traffic.admission import Admission, AdmissionSettings, Shed, Ticket
from fleetgate.traffic.batch_lane import BatchLane
from fleetgate.traffic.concurrency import ConcurrencyLimit, LimitSettings
from fleetgate.traffic.priority import Priority
from fleetgate.traffic.tenants import Tenant, TenantSettings

CRITICAL, STANDARD, SHEDDABLE = Priority.CRITICAL, Priority.STANDARD, Priority.SHEDDABLE


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tenant(name: str, **fields: Any) -> Tenant:
    return Tenant.of(msgspec.convert({"name": name, **fields}, TenantSettings))


def admission(
    limit: int, clock: Clock, tenants: list[Tenant] | None = None, batch_cap: int = 1,
    engine_priority: bool = False, **settings: Any,
) -> Admission:  # fmt: skip
    pool = Pool("m", [BackendState(Backend("b", "http://127.0.0.1:1", ("m",)))])
    fixed = ConcurrencyLimit(LimitSettings(max_in_flight=limit), pool, clock)
    known = {t.name: t for t in tenants or []}
    config = AdmissionSettings(**settings)
    # The batch lane's cap starts at its minimum, one per backend: `batch_cap` of them.
    lane = BatchLane(config.batch_lane, batch_cap, clock())
    return Admission(config, fixed, known, LoopClock(clock), lane, engine_priority)


def ticket(clock: Clock, name: str = "t", priority: Priority = STANDARD, *, batch: bool = False,
           wait_s: float = 5.0, cost: float = 10.0) -> Ticket:  # fmt: skip
    return Ticket(name, priority, batch, cost, 1.0, clock.now + wait_s)


async def waiting(adm: Admission, t: Ticket) -> asyncio.Task[None]:
    """`t` waiting in the queue (a task), once it is queued."""
    task = asyncio.get_running_loop().create_task(adm.wait(t))
    await asyncio.sleep(0)  # it runs to its first wait: queued, or admitted at once
    assert t.future is not None or task.done()
    return task


async def test_below_the_limit_requests_go_at_once_and_then_wait_their_turn() -> None:
    clock = Clock()
    adm = admission(2, clock)
    first, second, third = ticket(clock), ticket(clock), ticket(clock)
    assert adm.admit_now(first) and adm.admit_now(second)
    assert not adm.admit_now(third)
    task = await waiting(adm, third)
    assert adm.waiting == 1 and not task.done()
    adm.leave(first)
    await task
    assert third.admitted and adm.in_flight == 2 and adm.waiting == 0


async def test_a_tenant_that_sends_more_is_predicted_to_wait_longer() -> None:
    clock = Clock()
    adm = admission(1, clock)
    held = ticket(clock)
    assert adm.admit_now(held)
    clock.now += 1.0
    adm.leave(held)  # a drain rate of 1/s
    held = ticket(clock)
    assert adm.admit_now(held)
    heavy = [await waiting(adm, ticket(clock, "heavy", wait_s=60)) for _ in range(20)]
    light = [await waiting(adm, ticket(clock, "light", wait_s=60)) for _ in range(2)]
    # A third tenant's request would be served after about one of each: no shedding.
    newcomer = await waiting(adm, ticket(clock, "new", wait_s=5))
    # The heavy tenant's next one would be served after all its twenty: shed at once.
    with pytest.raises(Shed):
        await adm.wait(ticket(clock, "heavy", wait_s=5))
    for task in (*heavy, *light, newcomer):
        task.cancel()
    await asyncio.gather(*heavy, *light, newcomer, return_exceptions=True)


async def test_the_most_urgent_class_goes_first_whatever_the_order_it_came_in() -> None:
    clock = Clock()
    adm = admission(1, clock)
    running = ticket(clock)
    assert adm.admit_now(running)
    order: list[Priority] = []
    tickets = [ticket(clock, f"t{p}", p) for p in (SHEDDABLE, STANDARD, CRITICAL)]
    tasks = [await waiting(adm, t) for t in tickets]
    for task, t in zip(tasks, tickets, strict=True):
        task.add_done_callback(lambda _, t=t: order.append(t.priority))
    current = running
    for _ in tickets:
        adm.leave(current)
        await asyncio.sleep(0)
        current = next(t for t in tickets if t.admitted)
    await asyncio.gather(*tasks)
    assert order == [CRITICAL, STANDARD, SHEDDABLE]
    # A newcomer does not pass those waiting in its class or above.
    adm.leave(current)
    assert adm.admit_now(ticket(clock, priority=SHEDDABLE))


async def test_a_request_not_admitted_by_its_deadline_is_shed_with_a_retry_after() -> None:
    clock = Clock()
    adm = admission(1, clock)
    assert adm.admit_now(ticket(clock))
    late = ticket(clock, wait_s=0.02)
    with pytest.raises(Shed, match="No place opened") as info:
        await adm.wait(late)
    assert info.value.retry_after_s >= 1 and info.value.code == "queue_timeout"
    assert adm.waiting == 0 and not late.admitted


async def test_a_wait_longer_than_the_deadline_is_refused_at_once() -> None:
    clock = Clock()
    adm = admission(1, clock)
    held = ticket(clock)
    assert adm.admit_now(held)
    for _ in range(5):  # one request leaves every 2 s: a drain rate of 0.5/s
        clock.now += 2.0
        adm.leave(held)
        held = ticket(clock)
        assert adm.admit_now(held)
    queued = [await waiting(adm, ticket(clock, "q", wait_s=60)) for _ in range(10)]
    with pytest.raises(Shed, match="would wait about") as info:
        await adm.wait(ticket(clock, "q", wait_s=5))  # behind its own ten, at 0.5/s
    assert info.value.retry_after_s > 5
    # Another tenant of the class is served before most of q's (fair queuing): it may wait.
    other = await waiting(adm, ticket(clock, "other", wait_s=5))
    assert not other.done()
    queued.append(other)
    # A critical request has only the critical queue ahead of it: it may wait.
    urgent = ticket(clock, "urgent", CRITICAL, wait_s=5)
    task = await waiting(adm, urgent)
    adm.leave(held)
    await task
    assert urgent.admitted
    for task in queued:
        task.cancel()
    await asyncio.gather(*queued, return_exceptions=True)
    assert adm.waiting == 0


async def test_a_full_queue_sheds_the_newest_of_the_lowest_class_for_a_higher_one() -> None:
    clock = Clock()
    adm = admission(1, clock, max_queue=2)
    assert adm.admit_now(ticket(clock))
    low_old = await waiting(adm, ticket(clock, "a", SHEDDABLE))
    low_new = await waiting(adm, ticket(clock, "a", SHEDDABLE))
    high = await waiting(adm, ticket(clock, "b", CRITICAL))
    with pytest.raises(Shed, match="more urgent request"):
        await low_new
    assert not low_old.done() and adm.waiting == 2
    with pytest.raises(Shed, match="queue of this model is full"):
        await adm.wait(ticket(clock, "c", SHEDDABLE))
    for task in (low_old, high):
        task.cancel()
    await asyncio.gather(low_old, high, return_exceptions=True)


async def test_a_tenant_at_its_cap_waits_even_when_the_pool_has_room() -> None:
    clock = Clock()
    capped = tenant("capped", max_concurrency=1)
    adm = admission(10, clock, [capped])
    first = ticket(clock, "capped")
    assert adm.admit_now(first)
    second = ticket(clock, "capped")
    assert not adm.admit_now(second)
    task = await waiting(adm, second)
    assert adm.admit_now(ticket(clock, "other"))  # others are not held up
    adm.leave(first)
    await task
    assert second.admitted
    third = ticket(clock, "capped", wait_s=0.02)
    with pytest.raises(Shed, match="most at once") as info:  # its own cap: a 429, not a 503
        await adm.wait(third)
    assert info.value.status == 429 and info.value.code == "concurrency_limit_exceeded"


async def test_a_tenants_floor_is_kept_free_of_other_tenants() -> None:
    clock = Clock()
    floored = tenant("floored", min_concurrency=2)
    adm = admission(4, clock, [floored])
    others = [ticket(clock, "other") for _ in range(3)]
    assert [adm.admit_now(t) for t in others] == [True, True, False]  # 2 of 4 kept free
    assert adm.admit_now(ticket(clock, "floored"))
    assert adm.admit_now(ticket(clock, "floored"))
    assert not adm.admit_now(ticket(clock, "floored"))  # above its floor: the pool is full


async def test_batch_requests_use_only_spare_capacity() -> None:
    clock = Clock()
    adm = admission(4, clock, batch_cap=2, batch_share=0.5)
    batch = [ticket(clock, "batch", batch=True) for _ in range(3)]
    assert [adm.admit_now(t) for t in batch] == [True, True, False]  # the lane's cap
    queued_batch = await waiting(adm, batch[2])
    interactive = [ticket(clock, "i") for _ in range(3)]
    assert [adm.admit_now(t) for t in interactive] == [True, True, False]
    waiting_interactive = await waiting(adm, interactive[2])
    adm.leave(batch[0])  # a place opens: the interactive request takes it
    await waiting_interactive
    assert interactive[2].admitted and not batch[2].admitted
    adm.leave(interactive[0])
    adm.leave(interactive[1])
    await queued_batch
    assert batch[2].admitted


async def test_a_client_that_leaves_while_waiting_gives_up_its_place() -> None:
    clock = Clock()
    adm = admission(1, clock)
    running = ticket(clock)
    assert adm.admit_now(running)
    gone = await waiting(adm, ticket(clock))
    stays = ticket(clock)
    kept = await waiting(adm, stays)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert adm.waiting == 1
    adm.leave(running)
    await kept
    assert stays.admitted and adm.in_flight == 1


async def test_idle_time_does_not_count_as_a_slow_drain() -> None:
    clock = Clock()
    adm = admission(2, clock)
    clock.now += 3600  # an hour with nothing to do
    first, second = ticket(clock), ticket(clock)
    assert adm.admit_now(first) and adm.admit_now(second)
    clock.now += 0.5
    adm.leave(first)  # one left in the first half second of work: 2 per second
    assert adm.rate == pytest.approx(2.0)  # not 1/3600, nor an average still warming up
    adm.leave(second)


async def test_each_class_leaves_headroom_to_the_classes_above_it() -> None:
    clock = Clock()
    adm = admission(10, clock)  # headroom 0.1: standard to 9 in flight, sheddable to 8
    assert all(adm.admit_now(ticket(clock, priority=SHEDDABLE)) for _ in range(8))
    assert not adm.admit_now(ticket(clock, priority=SHEDDABLE))
    assert adm.admit_now(ticket(clock, priority=STANDARD))
    assert not adm.admit_now(ticket(clock, priority=STANDARD))
    assert adm.admit_now(ticket(clock, priority=CRITICAL))  # the last place is critical's
    assert not adm.admit_now(ticket(clock, priority=CRITICAL))
    assert adm.in_flight == 10


async def test_a_freed_place_under_the_headroom_goes_only_to_a_class_that_may_use_it() -> None:
    clock = Clock()
    adm = admission(10, clock)
    held = [ticket(clock, priority=CRITICAL) for _ in range(10)]
    assert all(adm.admit_now(t) for t in held)
    low = await waiting(adm, ticket(clock, priority=SHEDDABLE))
    adm.leave(held[0])  # 9 in flight: over sheddable's 8
    await asyncio.sleep(0)
    assert not low.done() and adm.waiting == 1
    urgent = await waiting(adm, ticket(clock, priority=CRITICAL))
    await urgent  # critical may use the place at once
    for t in held[1:3]:  # 8 in flight: still none for sheddable
        adm.leave(t)
    await asyncio.sleep(0)
    assert not low.done()
    adm.leave(held[3])  # 7: sheddable's turn
    await low
    assert adm.in_flight == 8


async def test_no_headroom_lets_every_class_fill_the_limit() -> None:
    clock = Clock()
    adm = admission(10, clock, headroom=0.0)
    assert all(adm.admit_now(ticket(clock, priority=SHEDDABLE)) for _ in range(10))
    assert not adm.admit_now(ticket(clock, priority=CRITICAL))


async def test_with_engine_priority_critical_requests_may_go_past_the_limit() -> None:
    clock = Clock()
    adm = admission(10, clock, engine_priority=True, critical_overcommit=0.5)
    assert all(adm.admit_now(ticket(clock, priority=STANDARD)) for _ in range(9))
    assert not adm.admit_now(ticket(clock, priority=STANDARD))
    # The engines prefill critical requests first: up to 1.5 times the limit of them go.
    assert all(adm.admit_now(ticket(clock, priority=CRITICAL)) for _ in range(6))
    assert not adm.admit_now(ticket(clock, priority=CRITICAL))
    assert adm.in_flight == 15


async def test_places_taken_at_once_count_when_the_class_starts_to_wait() -> None:
    clock = Clock()
    adm = admission(4, clock, headroom=0.0)
    # The pool fills first come first served: "a", sending 3 times what "b" does, takes 3.
    burst = [ticket(clock, n) for n in ("a", "a", "b", "a")]
    assert all(adm.admit_now(t) for t in burst)
    queued = [ticket(clock, "a", wait_s=60) for _ in range(4)]
    queued += [ticket(clock, "b", wait_s=60) for _ in range(4)]
    tasks = [await waiting(adm, t) for t in queued]
    for t in burst:  # the burst ends: its 4 places go to the queue
        adm.leave(t)
    await asyncio.sleep(0)
    taken = Counter(t.tenant for t in queued if t.admitted)
    # Each has had 4 places in all: "b" first gets what it is behind by.
    assert taken == {"b": 3, "a": 1}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
