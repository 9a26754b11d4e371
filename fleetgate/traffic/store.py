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
from typing import Any, Protocol

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
    """Buckets in this process's memory, on the injected clock. Each bucket's state is a
    cell (`_cell`), a list changed in place; a caller that asks for the same buckets with
    every request (a key's limits: traffic/limits.py) may `pin` their cells and take and give
    through them, without finding them again each time."""

    _SWEEP_EVERY = 4096  # takes between sweeps of forgotten buckets

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._cells: dict[str, list[Any]] = {}  # by the bucket's key
        self._calls = 0

    def pin(self, requests: Sequence[Bucket], sized: Sequence[Bucket]) -> Pinned:
        """The cells of refilling buckets (full ones for those not remembered), never swept,
        for a caller that keeps them (bounded by the config: one set per key): `requests`
        buckets cost a request 1, `sized` ones its size."""
        buckets = (*requests, *sized)
        if any(bucket.rate_per_s <= 0 for bucket in buckets):
            raise ValueError("only refilling buckets are pinned (a budget's period ends)")
        cells = self._cells_of(buckets, self._clock())
        for cell in cells:
            cell[_PINNED] = True
        return Pinned(self._clock, self.give_cells, cells, len(requests))

    def _cells_of(self, buckets: Sequence[Bucket], now: float) -> list[list[Any]]:
        cells = self._cells
        found = []
        for bucket in buckets:
            cell = cells.get(bucket.key)
            if cell is None:  # a full bucket: remembered as one, the same state
                cell = cells[bucket.key] = _cell(bucket, bucket.capacity, now)
            found.append(cell)
        return found

    async def take(self, buckets: Sequence[Bucket], costs: Sequence[float]) -> Taken:
        return self.take_now(buckets, costs)

    def take_now(self, buckets: Sequence[Bucket], costs: Sequence[float]) -> Taken:
        """`take`, without a coroutine (the store of one process never waits)."""
        now = self._clock()
        return self.take_cells(self._cells_of(buckets, now), costs, now)

    def take_cells(
        self, cells: Sequence[list[Any]], costs: Sequence[float], now: float | None = None
    ) -> Taken:
        """`take_now` from cells (`pin`'s), at `now` (None: the clock's)."""
        if now is None:
            now = self._clock()
        self._calls += 1
        if self._calls >= self._SWEEP_EVERY:
            self._sweep(now)
        found = []
        for cell, cost in zip(cells, costs):  # noqa: B905 (same length; strict costs time)
            level, then, capacity, rate, bucket, _ = cell
            if rate:  # `_level` inline: two calls a request were a tenth of this
                if now > then:
                    level += rate * (now - then)
                if level > capacity:
                    level = capacity
            else:
                level = _level(cell, bucket, now)
            if level < cost:  # why, at the same instant (a later one may have refilled it)
                return _refused(cells, costs, now)
            found.append((cell, level - cost))
        left = []
        for cell, level in found:
            cell[0] = level
            cell[1] = now
            left.append(level)
        return Taken(True, left, 0.0)

    async def give(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> None:
        self.give_now(buckets, amounts)

    def give_now(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> None:
        now = self._clock()
        self.give_cells(self._cells_of(buckets, now), amounts, now)

    def give_cells(
        self, cells: Sequence[list[Any]], amounts: Sequence[float], now: float | None = None
    ) -> None:
        """`give_now` to cells (`pin`'s)."""
        for cell, amount in zip(cells, amounts):  # noqa: B905 (same length)
            if amount >= 0 and cell[_RATE] > 0:
                # Added to the level as it was, not as it is: the same level at every later
                # time, the cap applied when it is read (a debt, below, must see the cap now).
                cell[0] += amount
            else:
                if now is None:
                    now = self._clock()
                bucket = cell[_BUCKET]
                cell[0], cell[1] = min(bucket.capacity, _level(cell, bucket, now) + amount), now

    def _sweep(self, now: float) -> None:
        """Forget the buckets that are full again, and the budgets whose period is over (not
        a pinned one)."""
        self._calls = 0
        cells = self._cells
        for key in [
            k
            for k, (level, then, _, _, bucket, pinned) in cells.items()
            if not pinned and now >= bucket.expires(level, then)
        ]:
            del cells[key]

    def __len__(self) -> int:
        return len(self._cells)


class Pinned:
    """A caller's refilling buckets pinned in the in-process store (`MemoryStore.pin`): the
    ones it asks for with every request (a key's rate limits), taken from and given to with
    no lookup and no list of costs. The first `requests` cells cost a request 1 (they count
    requests), the others its size (its tokens). Its takes are not counted toward the
    store's sweeps: only unpinned buckets are swept (budgets), and each is made by a take
    that is counted, so what waits for a sweep stays bounded."""

    __slots__ = ("_clock", "_counted", "_give", "_one", "_sized", "cells", "take")

    def __init__(
        self,
        clock: Callable[[], float],
        give_cells: Callable[[Sequence[list[Any]], Sequence[float]], None],
        cells: list[list[Any]],
        requests: int,
    ) -> None:
        self._clock = clock
        self._give = give_cells  # the store's, for a debt (`give`)
        self.cells = cells
        self._counted = requests
        self._sized = cells[requests:]
        self._one = self._sized[0] if len(self._sized) == 1 else None  # given back to alone
        # Take 1 or `size` from each bucket, all or none: their levels after, in the order
        # of `cells`, or None when one is short and nothing was taken (`take_cells` of
        # `cells` then says why). A tenant's requests and tokens limits (the common shape)
        # take in half the time of any other number of buckets.
        self.take: Callable[[float], tuple[float, ...] | None] = (
            self._take_pair if requests == 1 and len(cells) == 2 else self._take_any
        )

    def _take_pair(self, size: float) -> tuple[float, ...] | None:
        now = self._clock()
        counted, sized = self.cells
        # `_level` inline, on refilling buckets
        requests = counted[0]
        if now > counted[1]:
            requests += counted[_RATE] * (now - counted[1])
        if requests > counted[2]:  # capped even with no time gone: a give-back adds (`give`)
            requests = counted[2]
        tokens = sized[0]
        if now > sized[1]:
            tokens += sized[_RATE] * (now - sized[1])
        if tokens > sized[2]:
            tokens = sized[2]
        if requests < 1.0 or tokens < size:
            return None
        requests -= 1.0
        tokens -= size
        counted[0], counted[1], sized[0], sized[1] = requests, now, tokens, now
        return (requests, tokens)

    def _take_any(self, size: float) -> tuple[float, ...] | None:
        now = self._clock()
        counted = self._counted
        levels = []
        for i, cell in enumerate(self.cells):  # `_level` inline, as above
            level = cell[0]
            if now > cell[1]:
                level += cell[_RATE] * (now - cell[1])
            if level > cell[2]:
                level = cell[2]
            level -= 1.0 if i < counted else size
            if level < 0:
                return None
            levels.append(level)
        for cell, level in zip(self.cells, levels):  # noqa: B905 (same length)
            cell[0] = level
            cell[1] = now
        return tuple(levels)

    def give(self, amount: float) -> None:
        """`amount` back to each bucket of the request's size (negative: it used more)."""
        if amount >= 0:
            # Added to the level as it was, not as it is: the same level at every later time,
            # the cap applied when it is read.
            one = self._one
            if one is not None:  # a tenant's tokens limit alone: no loop
                one[0] += amount
                return
            for cell in self._sized:
                cell[0] += amount
        else:
            self._give(self._sized, [amount] * len(self._sized))


def _refused(cells: Sequence[list[Any]], costs: Sequence[float], now: float) -> Taken:
    """What `take` answers when a bucket is short: every bucket's level, and the wait."""
    levels = [_level(cell, cell[_BUCKET], now) for cell in cells]
    wait = max(
        wait_for(level, cost, cell[_BUCKET].rate_per_s)
        for cell, level, cost in zip(cells, levels, costs)  # noqa: B905
    )
    return Taken(False, levels, wait)


_RATE, _BUCKET, _PINNED = 3, 4, 5  # a cell's fields: [level, then, capacity, rate, bucket, pinned]


def _cell(bucket: Bucket, level: float, now: float) -> list[Any]:
    """A bucket's state in memory: its level at `now`, with what `take_cells` reads of it."""
    return [level, now, bucket.capacity, bucket.rate_per_s, bucket, False]


def _level(cell: list[Any], bucket: Bucket, now: float) -> float:
    """A remembered bucket's level at `now`."""
    level: float = cell[0]
    then: float = cell[1]
    rate = bucket.rate_per_s
    if rate == 0:  # a budget: full again once its key expires (a new period has a new key)
        return bucket.capacity if now >= then + bucket.ttl_s else level
    if now > then:
        level += rate * (now - then)
    # Capped even with no time gone: a give-back adds to the level as it was (give_now).
    return level if level < bucket.capacity else bucket.capacity
