"""Where rate-limit and budget buckets live: one interface, an in-process store (the default,
one gateway) and a Redis store (several gateways enforcing one limit: traffic/redis_store.py).

A bucket holds up to `capacity` and refills at `rate_per_s` (0 for a budget, which a new
period replaces with a new key). `take` is all-or-nothing over several buckets: a request
either takes its cost from every bucket that applies to it (tenant, key, budget) or from
none, so a refused request never uses up part of a limit. `give` returns what a request
reserved and did not use, or takes what it used beyond (a level may go below zero: the
debt delays the next request, so no usage slips past a limit).

    level(now) = min(capacity, level(then) + rate_per_s * (now - then))
    wait_s     = (cost - level(now)) / rate_per_s      for a bucket short of `cost`
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec


@dataclass(frozen=True, slots=True)
class Bucket:
    key: str  # unique across the gateways sharing a store
    capacity: float
    rate_per_s: float  # refill; 0: only a new key (a new period) refills it
    ttl_s: float = 0.0  # a bucket that does not refill: how long its key lives (its period)

    def expires(self, level: float, now: float) -> float:
        """When its state may be forgotten: full again, or its period over."""
        if self.rate_per_s > 0:
            return now + (self.capacity - level) / self.rate_per_s
        return now + self.ttl_s


class Taken(msgspec.Struct, gc=False):
    """What `take` did: `ok` if it took every cost; `levels` of each bucket after (before,
    when refused); `wait_s` until every bucket could pay (inf: not before a new period).
    A struct made in C: a NamedTuple's constructor is Python and cost 0.2 us a request."""

    ok: bool
    levels: list[float]
    wait_s: float


class Account(Protocol):
    """The refilling buckets one caller takes from with every request (a key's rate limits),
    as one: its `requests` buckets cost a request 1, its `sized` ones the request's size."""

    async def take(self, size: float) -> Taken:
        """Take 1 or `size` from each bucket, all or none (levels in the order requests,
        sized)."""

    async def give(self, amount: float) -> None:
        """`amount` back to each sized bucket (negative: the request used more)."""


class LimitStore(Protocol):
    async def take(self, buckets: Sequence[Bucket], costs: Sequence[float]) -> Taken:
        """Take each cost from its bucket, all or none."""

    async def give(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> None:
        """Add each amount (negative: take more) to its bucket, at most to its capacity."""

    def account(self, requests: Sequence[Bucket], sized: Sequence[Bucket]) -> Account:
        """The account of buckets asked for together with every request (refilling ones)."""


class BucketsAccount:
    """An account as plain takes and gives of its buckets: a store with nothing faster."""

    __slots__ = ("_requests", "_sized", "_store", "buckets")

    def __init__(self, store: LimitStore, requests: Sequence[Bucket], sized: Sequence[Bucket]):
        self._store = store
        self._requests = len(requests)
        self._sized = tuple(sized)
        self.buckets = (*requests, *sized)

    async def take(self, size: float) -> Taken:
        costs = [1.0] * self._requests + [size] * len(self._sized)
        return await self._store.take(self.buckets, costs)

    async def give(self, amount: float) -> None:
        await self._store.give(self._sized, [amount] * len(self._sized))


def wait_for(level: float, cost: float, rate_per_s: float) -> float:
    """How long until a bucket at `level` can pay `cost`."""
    if level >= cost:
        return 0.0
    return (cost - level) / rate_per_s if rate_per_s > 0 else math.inf


class MemoryStore:
    """Buckets in this process's memory, on the injected clock, each one's state a
    `BucketState` changed in place. It never waits: its coroutines answer at once. A key's
    `account` holds its buckets' states, taken from and given to without finding them again."""

    _SWEEP_EVERY = 4096  # takes between sweeps of forgotten buckets

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._states: dict[str, BucketState] = {}  # by the bucket's key
        self._calls = 0

    def account(self, requests: Sequence[Bucket], sized: Sequence[Bucket]) -> MemoryAccount:
        """The states of refilling buckets (full ones for those not remembered), never swept,
        for a caller that keeps them (bounded by the config: one set per key)."""
        buckets = (*requests, *sized)
        if any(bucket.rate_per_s <= 0 for bucket in buckets):
            raise ValueError("only refilling buckets make an account (a budget's period ends)")
        states = self._states_of(buckets, self._clock())
        for state in states:
            state.pinned = True
        return MemoryAccount(self._clock, self._give, states, len(requests))

    def _states_of(self, buckets: Sequence[Bucket], now: float) -> list[BucketState]:
        known = self._states
        found = []
        for bucket in buckets:
            state = known.get(bucket.key)
            if state is None:  # a full bucket: remembered as one, the same state
                state = known[bucket.key] = BucketState(bucket, bucket.capacity, now)
            found.append(state)
        return found

    async def take(self, buckets: Sequence[Bucket], costs: Sequence[float]) -> Taken:
        now = self._clock()
        self._calls += 1
        if self._calls >= self._SWEEP_EVERY:
            self._sweep(now)
        states = self._states_of(buckets, now)
        levels = [state.level_at(now) for state in states]
        if any(level < cost for level, cost in zip(levels, costs, strict=True)):
            return _refused(states, levels, costs)
        left = []
        for state, level, cost in zip(states, levels, costs, strict=True):
            state.set(level - cost, now)
            left.append(level - cost)
        return Taken(True, left, 0.0)

    async def give(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> None:
        self._give(self._states_of(buckets, self._clock()), amounts)

    def _give(self, states: Sequence[BucketState], amounts: Sequence[float]) -> None:
        now: float | None = None
        for state, amount in zip(states, amounts, strict=True):
            if amount >= 0 and state.bucket.rate_per_s > 0:
                state.refund(amount)
            else:
                if now is None:
                    now = self._clock()
                capacity = state.bucket.capacity
                state.set(min(capacity, state.level_at(now) + amount), now)

    def _sweep(self, now: float) -> None:
        """Forget the buckets that are full again, and the budgets whose period is over (not
        one of an account)."""
        self._calls = 0
        states = self._states
        for key in [k for k, state in states.items() if not state.pinned and state.expired(now)]:
            del states[key]

    def __len__(self) -> int:
        return len(self._states)


class BucketState:
    """A bucket's level in memory, as of `then`:

    level(now) = min(capacity, level + rate_per_s * (now - then))     (refilling)
    level(now) = capacity once `then + ttl_s` has passed, else level   (a budget)
    """

    __slots__ = ("bucket", "level", "pinned", "then")

    def __init__(self, bucket: Bucket, level: float, now: float) -> None:
        self.bucket = bucket
        self.level = level
        self.then = now
        self.pinned = False  # kept by a caller (`MemoryStore.pin`): never swept

    def level_at(self, now: float) -> float:
        bucket = self.bucket
        rate = bucket.rate_per_s
        if rate == 0:  # a budget: full again once its key expires (a new period has a new key)
            return bucket.capacity if now >= self.then + bucket.ttl_s else self.level
        level = self.level
        if now > self.then:
            level += rate * (now - self.then)
        # Capped even with no time gone: a refund adds to the level as it was (`refund`).
        return level if level < bucket.capacity else bucket.capacity

    def set(self, level: float, now: float) -> None:
        self.level, self.then = level, now

    def refund(self, amount: float) -> None:
        """Add `amount` >= 0 to a refilling bucket's level as it was, not as it is: the same
        level at every later time, the cap applied when it is read."""
        self.level += amount

    def expired(self, now: float) -> bool:
        """Whether it may be forgotten: full again, or its period over."""
        return now >= self.bucket.expires(self.level, self.then)


class MemoryAccount:
    """An account in the in-process store (`MemoryStore.account`): a key's refilling buckets'
    states, taken from and given to with no lookup. The first `requests` states cost a
    request 1 (they count requests), the others its size (its tokens). Its takes are not
    counted toward the store's sweeps: only unpinned buckets are swept (budgets), and each is
    made by a take that is counted, so what waits for a sweep stays bounded."""

    __slots__ = ("_clock", "_give", "_sized_or_not", "sized", "states")

    def __init__(
        self,
        clock: Callable[[], float],
        give: Callable[[Sequence[BucketState], Sequence[float]], None],
        states: list[BucketState],
        requests: int,
    ) -> None:
        self._clock = clock
        self._give = give  # the store's, for a debt (`give`)
        self.states = states
        self.sized = states[requests:]
        # Each state, and whether it costs the request's size (else 1: it counts requests).
        self._sized_or_not = tuple((state, i >= requests) for i, state in enumerate(states))

    async def take(self, size: float) -> Taken:
        now = self._clock()
        left = []
        for state, sized in self._sized_or_not:
            level = state.level_at(now) - (size if sized else 1.0)
            if level < 0:  # short: nothing is taken
                levels = [state.level_at(now) for state in self.states]
                costs = [size if sized else 1.0 for _, sized in self._sized_or_not]
                return _refused(self.states, levels, costs)
            left.append(level)
        for state, level in zip(self.states, left, strict=True):
            state.level, state.then = level, now
        return Taken(True, left, 0.0)

    async def give(self, amount: float) -> None:
        if amount >= 0:  # added to the level as it was (BucketState.refund)
            for state in self.sized:
                state.level += amount
        else:
            self._give(self.sized, [amount] * len(self.sized))


def _refused(
    states: Sequence[BucketState], levels: Sequence[float], costs: Sequence[float]
) -> Taken:
    """What `take` answers when a bucket is short: every bucket's level, and the wait."""
    wait = max(
        wait_for(level, cost, state.bucket.rate_per_s)
        for state, level, cost in zip(states, levels, costs, strict=True)
    )
    return Taken(False, list(levels), wait)
