"""Deadlines for many connections with one timer: a sweep every tick instead of a timer per
request (creating and cancelling timers cost ~4 per proxied request before; now none).

A connection sets `deadline` (the clock's time, `math.inf` for none) whenever its phase
changes; the sweeper calls `expire()` on those past it. Timeouts are therefore enforced within
one tick.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Collection
from typing import Generic, Protocol, TypeVar

from fleetgate.clock import Clock

TICK_S = 0.05  # how late a timeout may fire, at most
NEVER = math.inf


class Expiring(Protocol):
    deadline: float

    def expire(self) -> None:
        """The deadline passed: act on it (and clear or move `deadline`)."""


T = TypeVar("T", bound=Expiring)


class DeadlineSweeper(Generic[T]):
    """Every `tick_s`, expires the members of `members` whose deadline has passed."""

    def __init__(self, clock: Clock, members: Collection[T], tick_s: float = TICK_S) -> None:
        self._clock = clock
        self._members = members
        self._tick_s = tick_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Sweep from now on, on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._clock.sleep(self._tick_s)
            now = self._clock.now()
            for member in [m for m in self._members if m.deadline <= now]:
                member.expire()
