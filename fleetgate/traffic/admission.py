"""Admission: when a pool is saturated, requests wait in front of routing, by class and fairly.

A pool is saturated for a class when the requests it serves reach that class's share of its
concurrency limit (`concurrency.py`): all of it for `critical`, less `headroom` for each class below
(standard 90%, sheddable and the batch lane 80%), so the classes above always find room left.
Below it every request goes at once (one comparison). At it, a request waits in the queue of
its class: `critical` before `standard` before `sheddable`, each a fair queue across tenants
(queue.py), and batch-lane requests only when no interactive request waits and at most
`batch_share` of the limit is theirs. A request leaves the queue when a request ends and
frees its place, or at its deadline with 503 and a Retry-After from the queue's drain rate.

Shedding: a request whose wait, predicted from the requests ahead of it and the drain rate,
is longer than its deadline is refused at once (503), without waiting for nothing; when the
queue is full, a request of a higher class takes the place of the newest of the lowest class
queued. So as saturation rises, sheddable requests go first, then standard, critical last.

Tenants' concurrency: at its `max_concurrency` a tenant's requests wait even when the pool
has room; below its `min_concurrency` they go at once even when it has none (the floor is
kept out of what the others may take).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetgate.clock import Clock
from fleetgate.settings import Settings, at_least, positive_seconds, within
from fleetgate.traffic.batch_lane import BatchLane, BatchLaneSettings
from fleetgate.traffic.concurrency import ConcurrencyLimit, LimitSettings
from fleetgate.traffic.priority import Priority
from fleetgate.traffic.queue import FairQueue
from fleetgate.traffic.tenants import Tenant

_TICK_S = 0.25  # how often the drain rate is updated and the limit asked to move


class AdmissionSettings(Settings, frozen=True):
    """A pool's admission control (`pools[].admission`)."""

    enabled: bool = True  # off: every request goes to routing at once, however busy
    limit: LimitSettings = LimitSettings()  # how many it serves at once (concurrency.py)
    max_queue: int = 2048  # requests waiting at most; beyond, the lowest class is shed
    # Of the concurrency limit batch-lane requests may hold at most; under it the lane's own
    # cap keeps interactive requests' TTFT near its best (batch_lane.py).
    batch_share: float = 0.5
    batch_lane: BatchLaneSettings = BatchLaneSettings()
    # Of the limit, what each class leaves to the classes above it: standard requests go while
    # fewer than 90% of it are in flight, sheddable (and batch) 80%, critical up to all of it.
    # So a critical request finds room at once when the pool fills (a cold start's first
    # burst took every place first come first served: critical TTFT p99 4 s in
    # benchmarks/overload.py) or when the limit comes down. An adaptive limit grows past
    # what the lower classes leave; a fixed one leaves it unused when no critical come.
    headroom: float = 0.1
    # With the pool's engine_priority, critical requests go while fewer than the limit times
    # (1 + this) are in flight: the engines prefill them first and preempt the least urgent,
    # so they need not wait behind places the lower classes took first (a cold start's burst,
    # a cut of the limit: critical TTFT p99 2.9 s with engine priority and headroom alone).
    critical_overcommit: float = 1.0
    drain_window_s: float = 10.0  # the drain rate (for Retry-After) is averaged over this

    def __post_init__(self) -> None:
        at_least("max_queue", self.max_queue, 0)
        within("headroom", self.headroom, 0, 0.45)
        at_least("critical_overcommit", self.critical_overcommit, 0)
        within("batch_share", self.batch_share, 0, 1, open_low=True)
        positive_seconds("drain_window_s", self.drain_window_s)


class Shed(Exception):
    """The request is not admitted: 503 with Retry-After, or 429 when what held it back was
    its own tenant's concurrency cap."""

    def __init__(
        self, message: str, retry_after_s: float, code: str = "overloaded", status: int = 503
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        self.code = code
        self.status = status


@dataclass(slots=True, eq=False)
class Ticket:
    """A request's place: waiting, then admitted until `Admission.leave`."""

    tenant: str
    priority: Priority
    batch: bool
    cost: float  # estimated tokens, for fairness
    weight: float
    deadline: float
    floor: bool = False  # admitted under its tenant's guaranteed floor
    admitted: bool = False
    gone: bool = False  # left the queue on its own
    future: asyncio.Future[None] | None = field(default=None, repr=False)


class Admission:
    """One pool's admission queue (module docstring)."""

    def __init__(
        self,
        settings: AdmissionSettings,
        limit: ConcurrencyLimit,
        tenants: Mapping[str, Tenant],
        clock: Clock,
        lane: BatchLane | None = None,
        engine_priority: bool = False,
    ) -> None:
        self._settings = settings
        self._limit = limit
        self._clock = clock  # a queued request's wait
        self._now = clock.now
        self._lane = lane or BatchLane(settings.batch_lane, 1, clock.now())
        self._caps = {n: t.settings.max_concurrency for n, t in tenants.items()
                      if t.settings.max_concurrency is not None}  # fmt: skip
        self._floors = {n: t.settings.min_concurrency for n, t in tenants.items()
                        if t.settings.min_concurrency > 0}  # fmt: skip
        self._queues = [FairQueue[Ticket]() for _ in Priority]
        # The share of the limit each class may fill (`headroom`), by Priority.
        self._room = [1.0 - settings.headroom * p for p in Priority]
        if engine_priority:
            self._room[Priority.CRITICAL] = 1.0 + settings.critical_overcommit
        self._batch = FairQueue[Ticket]()
        self.in_flight = 0  # admitted requests not yet left
        # Each tenant's admitted requests' cost / weight: what its places are charged in the
        # fair queue when a class starts to wait (queue.py, `charge`).
        self._holding: dict[str, float] = {}
        self.batch_in_flight = 0
        self._by_tenant: dict[str, int] = {}
        self._floor_room = sum(self._floors.values())  # floors not in use, kept free
        self.waiting = 0
        # Without caps or floors no per-tenant count is kept: the fast path.
        self._plain = not self._caps and not self._floors
        # Requests leaving per second, an average over `drain_window_s` corrected for its
        # start (the weight the average has gathered so far), so its first ticks read true.
        self.rate = 0.0
        self._rate_sum = 0.0
        self._rate_weight = 0.0
        self._left = 0  # requests that left since the last tick
        self._last_tick = clock.now()
        self._next_tick = self._last_tick + _TICK_S

    # -- the request path ------------------------------------------------------------

    def admit_now(self, ticket: Ticket) -> bool:
        """Admit `ticket` if it may go at once (no coroutine: the common case); False when
        it must `wait`."""
        if self._plain and not self.waiting and not ticket.batch:  # the fast path
            limit = self._limit
            level = limit.value * self._room[ticket.priority]
            if self.in_flight >= level:
                limit.reached()
                return False
            if not self.in_flight:
                self._busy_again()
            self.in_flight += 1
            ticket.admitted = True
            holding, name = self._holding, ticket.tenant
            holding[name] = holding.get(name, 0.0) + ticket.cost / ticket.weight
            if self.in_flight >= level:
                limit.reached()
            return True
        name = ticket.tenant
        if name in self._floors and self._by_tenant.get(name, 0) < self._floors[name]:
            ticket.floor = True
            self._admit(ticket)
            return True
        if self._may_go(ticket):
            self._admit(ticket)
            return True
        self._limit.reached()
        return False

    async def wait(self, ticket: Ticket) -> None:
        """Wait for a place until the ticket's deadline; `Shed` when there is none."""
        wait_s = ticket.deadline - self._now()
        predicted = self._predicted_wait(ticket)
        if predicted is not None and predicted > wait_s:
            raise Shed(self._shed_message(ticket, predicted), max(1.0, predicted))
        self._make_room(ticket)
        ticket.future = future = asyncio.get_running_loop().create_future()
        queue = self._queue_of(ticket)
        if not len(queue):  # the class starts to wait: places taken so far count in it
            for name, amount in self._holding.items():
                queue.charge(name, amount)
        queue.push(ticket, ticket.weight)
        self.waiting += 1
        self._dispatch()  # the queue held only requests gone already: room for this one
        try:
            await self._clock.within(asyncio.shield(future), max(0.0, wait_s))
        except TimeoutError:
            if not ticket.admitted:
                self._give_up(ticket)
                cap = self._caps.get(ticket.tenant)
                if cap is not None and self._by_tenant.get(ticket.tenant, 0) >= cap:
                    raise Shed(
                        f"This key's tenant already has {cap} requests in flight, its most at "
                        "once; retry when one has ended.", self._retry_after(ticket),
                        "concurrency_limit_exceeded", 429,
                    ) from None  # fmt: skip
                raise Shed(
                    f"No place opened in this model's {ticket.priority.label} queue within "
                    f"{max(0.0, wait_s):.3g} s; retry later.", self._retry_after(ticket),
                    "queue_timeout",
                ) from None  # fmt: skip
        except asyncio.CancelledError:
            if ticket.admitted:
                self.leave(ticket)
            else:
                self._give_up(ticket)
            raise

    @property
    def limit(self) -> int:
        """The pool's concurrency limit now."""
        return self._limit.value

    def leave(self, ticket: Ticket) -> None:
        """The admitted request has ended: its place goes to the next in line."""
        if not ticket.admitted:
            return
        ticket.admitted = False
        self.in_flight -= 1
        self._left += 1
        holding, name = self._holding, ticket.tenant
        left = holding[name] - ticket.cost / ticket.weight
        if left > 1e-9:
            holding[name] = left
        else:
            del holding[name]  # none in flight: forgotten (a pool's tenants come and go)
        if not self._plain or ticket.batch:
            self._count_out(ticket)
        now = self._now()
        if now >= self._next_tick:
            self._tick(now)
        if self.waiting:
            self._dispatch()

    def _count_out(self, ticket: Ticket) -> None:
        """The per-tenant and batch counts of a ticket that left."""
        if ticket.batch:
            self.batch_in_flight -= 1
        if self._plain:
            return
        name = ticket.tenant
        count = self._by_tenant[name] - 1
        self._by_tenant[name] = count
        if count < self._floors.get(name, 0):
            self._floor_room += 1
        cap = self._caps.get(name)
        if cap is not None and count == cap - 1:
            for queue in (*self._queues, self._batch):
                queue.release(name)

    def _busy_again(self) -> None:
        """The pool was idle: the drain rate is measured again from now (time with nothing
        in flight says nothing about how fast requests leave)."""
        now = self._now()
        self._left = 0
        self._last_tick = now
        self._next_tick = now + _TICK_S

    def _tick(self, now: float) -> None:
        """Once per `_TICK_S`: the drain rate, and the limit's move."""
        elapsed = now - self._last_tick
        share = min(1.0, elapsed / self._settings.drain_window_s)
        self._rate_sum += share * (self._left / elapsed - self._rate_sum)
        self._rate_weight += share * (1.0 - self._rate_weight)
        self.rate = self._rate_sum / self._rate_weight
        self._left = 0
        self._last_tick = now
        self._next_tick = now + _TICK_S
        self._limit.tick(now)
        share = self._limit.value * self._settings.batch_share
        self._lane.tick(now, self.batch_in_flight, share)

    # -- decisions ---------------------------------------------------------------------

    def _may_go(self, ticket: Ticket) -> bool:
        """Room for it now, and no one of its class or above waiting before it."""
        cap = self._caps.get(ticket.tenant)
        if cap is not None and self._by_tenant.get(ticket.tenant, 0) >= cap:
            return False
        if ticket.batch:
            return (
                not self._interactive_waiting() and not self._batch.ready() and self._batch_room()
            )
        if any(q.ready() for q in self._queues[: ticket.priority + 1]):
            return False
        return self.in_flight + self._floor_room < self._limit.value * self._room[ticket.priority]

    def _batch_room(self) -> bool:
        """Room for one more batch request: under the lowest class's share of the limit and
        under the lane's own cap (which tells the lane when the cap held one back)."""
        if self.in_flight + self._floor_room >= self._limit.value * self._room[-1]:
            return False
        if self.batch_in_flight >= self._lane.cap:
            self._lane.held()
            return False
        return True

    def _interactive_waiting(self) -> bool:
        return any(q.ready() for q in self._queues)

    def _under_floor(self, tenant: str) -> bool:
        floor = self._floors.get(tenant)
        return floor is not None and self._by_tenant.get(tenant, 0) < floor

    def _admit(self, ticket: Ticket) -> None:
        ticket.admitted = True
        if not self.in_flight:
            self._busy_again()
        self.in_flight += 1
        holding, name = self._holding, ticket.tenant
        holding[name] = holding.get(name, 0.0) + ticket.cost / ticket.weight
        if self.in_flight >= self._limit.value:
            self._limit.reached()
        if ticket.batch:
            self.batch_in_flight += 1
        if self._plain:
            return
        name = ticket.tenant
        count = self._by_tenant.get(name, 0) + 1
        self._by_tenant[name] = count
        if count <= self._floors.get(name, 0):
            self._floor_room -= 1
        cap = self._caps.get(name)
        if cap is not None and count >= cap:
            for queue in (*self._queues, self._batch):
                queue.hold(name)

    def _dispatch(self) -> None:
        """Admit waiting requests while there is room, the most urgent first."""
        limit = self._limit.value
        while self.waiting:
            ticket = None
            for room, queue in zip(self._room, self._queues):  # noqa: B905 (one per class)
                if self.in_flight + self._floor_room >= limit * room:
                    break  # no room for this class, nor for those below it
                ticket = queue.pop()
                if ticket is not None:
                    break
            if ticket is None and self._batch_room():
                ticket = self._batch.pop()
            if ticket is None:
                return
            self._wake(ticket)

    def _wake(self, ticket: Ticket) -> None:
        self.waiting -= 1
        self._admit(ticket)
        if ticket.future is not None and not ticket.future.done():
            ticket.future.set_result(None)

    def _give_up(self, ticket: Ticket) -> None:
        """A waiting ticket leaves on its own (deadline, or its client went away)."""
        if not ticket.gone:
            ticket.gone = True
            self.waiting -= 1
            queue = self._queue_of(ticket)
            if len(queue) > 2 * self.waiting + 64:  # gone entries pile up: sweep them
                queue.forget_gone()

    def _make_room(self, ticket: Ticket) -> None:
        """A full queue: the newest request of a lower class leaves for this one."""
        if self.waiting < self._settings.max_queue:
            return
        for queue in (self._batch, *reversed(self._queues[ticket.priority + 1 :])):
            while (victim := queue.remove_newest()) is not None:
                if victim.gone:
                    continue
                victim.gone = True
                self.waiting -= 1
                if victim.future is not None and not victim.future.done():
                    message = "A more urgent request took this one's place in the queue."
                    victim.future.set_exception(Shed(message, self._retry_after(victim)))
                return
        raise Shed(
            f"The queue of this model is full ({self._settings.max_queue} waiting); retry "
            "later.", self._retry_after(ticket),
        )  # fmt: skip

    def _queue_of(self, ticket: Ticket) -> FairQueue[Ticket]:
        return self._batch if ticket.batch else self._queues[ticket.priority]

    # -- how long a wait will be -------------------------------------------------------

    def _predicted_wait(self, ticket: Ticket) -> float | None:
        """Seconds until `ticket` would be admitted: the requests that would be served
        before it (the classes above its own, and those of its class the fair queue puts
        first: a tenant that already has many waiting waits longer), plus itself, over the
        drain rate; None while no request has left yet."""
        mine = self._queue_of(ticket)
        ahead = mine.ahead(ticket.tenant) + 1
        if ticket.batch:
            ahead += sum(len(q) for q in self._queues)
        else:
            ahead += sum(len(q) for q in self._queues[: ticket.priority])
        rate = self.rate
        if rate <= 0:
            return None
        return ahead / rate

    def _retry_after(self, ticket: Ticket) -> float:
        """When to try again: the predicted wait, at least 1 s."""
        return max(1.0, self._predicted_wait(ticket) or 1.0)

    def _shed_message(self, ticket: Ticket, predicted: float) -> str:
        return (
            f"This model is at capacity: a {ticket.priority.label} request would wait about "
            f"{predicted:.0f} s for a place, longer than its deadline. Retry later."
        )
