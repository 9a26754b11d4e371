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


@dataclass(frozen=True, slots=True)
class Taken:
    """What `take` did: `ok` if it took every cost; `levels` of each bucket after (before,
    when refused); `wait_s` until every bucket could pay (inf: not before a new period)."""

    ok: bool
    levels: tuple[float, ...]
    wait_s: float


class LimitStore(Protocol):
    async def take(self, buckets: Sequence[Bucket], costs: Sequence[float]) -> Taken:
        """Take each cost from its bucket, all or none."""

    async def give(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> None:
        """Add each amount (negative: take more) to its bucket, at most to its capacity."""


def wait_for(level: float, cost: float, rate_per_s: float) -> float:
    """How long until a bucket at `level` can pay `cost`."""
    if level >= cost:
        return 0.0
    return (cost - level) / rate_per_s if rate_per_s > 0 else math.inf


class MemoryStore:
    """Buckets in this process's memory, on the injected clock."""

    _SWEEP_EVERY = 4096  # takes between sweeps of forgotten buckets

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._state: dict[str, tuple[float, float, float]] = {}  # key: level, then, expires
        self._calls = 0

    def _level(self, bucket: Bucket, now: float) -> float:
        state = self._state.get(bucket.key)
        if state is None or now >= state[2]:
            return bucket.capacity
        level, then, _ = state
        if now <= then:
            return level
        return min(bucket.capacity, level + bucket.rate_per_s * (now - then))

    async def take(self, buckets: Sequence[Bucket], costs: Sequence[float]) -> Taken:
        return self.take_now(buckets, costs)

    def take_now(self, buckets: Sequence[Bucket], costs: Sequence[float]) -> Taken:
        """`take`, without a coroutine (the store of one process never waits)."""
        now = self._clock()
        self._calls += 1
        if self._calls % self._SWEEP_EVERY == 0:
            self._sweep(now)
        levels = [self._level(bucket, now) for bucket in buckets]
        wait = 0.0
        for bucket, level, cost in zip(buckets, levels, costs, strict=True):
            if level < cost:
                wait = max(wait, wait_for(level, cost, bucket.rate_per_s))
        if wait > 0:
            return Taken(False, tuple(levels), wait)
        state = self._state
        after = []
        for bucket, level, cost in zip(buckets, levels, costs, strict=True):
            left = level - cost
            state[bucket.key] = (left, now, bucket.expires(left, now))
            after.append(left)
        return Taken(True, tuple(after), 0.0)

    async def give(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> None:
        self.give_now(buckets, amounts)

    def give_now(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> None:
        now = self._clock()
        for bucket, amount in zip(buckets, amounts, strict=True):
            level = min(bucket.capacity, self._level(bucket, now) + amount)
            self._state[bucket.key] = (level, now, bucket.expires(level, now))

    def _sweep(self, now: float) -> None:
        for key in [k for k, (_, _, expires) in self._state.items() if now >= expires]:
            del self._state[key]

    def __len__(self) -> int:
        return len(self._state)
