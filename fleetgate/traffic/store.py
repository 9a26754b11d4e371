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
from typing import NamedTuple, Protocol


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


class Taken(NamedTuple):
    """What `take` did: `ok` if it took every cost; `levels` of each bucket after (before,
    when refused); `wait_s` until every bucket could pay (inf: not before a new period)."""

    ok: bool
    levels: list[float]
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
        if self._calls >= self._SWEEP_EVERY:
            self._sweep(now)
        state = self._state
        levels = []
        short = False
        for bucket, cost in zip(buckets, costs):  # noqa: B905 (same length; strict costs time)
            cell = state.get(bucket.key)
            if cell is None or now >= cell[2]:
                level = bucket.capacity
            else:
                level = cell[0] + bucket.rate_per_s * max(0.0, now - cell[1])
                if level > bucket.capacity:
                    level = bucket.capacity
            levels.append(level)
            if level < cost:
                short = True
        if short:
            wait = max(
                wait_for(level, cost, bucket.rate_per_s)
                for bucket, level, cost in zip(buckets, levels, costs)  # noqa: B905
            )
            return Taken(False, levels, wait)
        for i, bucket in enumerate(buckets):
            left = levels[i] = levels[i] - costs[i]
            rate = bucket.rate_per_s
            expires = now + (bucket.capacity - left) / rate if rate > 0 else now + bucket.ttl_s
            state[bucket.key] = (left, now, expires)
        return Taken(True, levels, 0.0)

    async def give(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> None:
        self.give_now(buckets, amounts)

    def give_now(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> None:
        now = self._clock()
        state = self._state
        for bucket, amount in zip(buckets, amounts):  # noqa: B905 (same length)
            level = min(bucket.capacity, self._level(bucket, now) + amount)
            state[bucket.key] = (level, now, bucket.expires(level, now))

    def _sweep(self, now: float) -> None:
        self._calls = 0
        for key in [k for k, (_, _, expires) in self._state.items() if now >= expires]:
            del self._state[key]

    def __len__(self) -> int:
        return len(self._state)
