"""The one clock of the request lifecycle: the time, and every timer (sleeps, waits with a
deadline, callbacks later). It is injected, so the same code runs on a virtual-time event loop
(tests, the simulator) as on the gateway's.

Code that only reads the time may take `clock.now` as a plain `Callable[[], float]`; code that
waits takes the `Clock`. Nothing of the lifecycle calls asyncio's timers itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic clock (the timers' own: a sleep of s moves it by s)."""

    async def sleep(self, seconds: float) -> None: ...

    async def within(self, aw: Awaitable[T], seconds: float) -> T:
        """What `aw` gives, if it comes within `seconds`; else `aw` is cancelled and
        TimeoutError raised. To wait without cancelling a task, pass `asyncio.shield(task)`."""

    def call_later(self, seconds: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        """Run `callback` after `seconds` (unless the handle is cancelled first)."""


class LoopClock:
    """The running event loop's timers, and `now` from time.monotonic: the clock asyncio's
    loop.time() reads (uvloop's loop.time() reads it too, but rounded to the millisecond and
    cached per loop turn: too coarse for a time to first token). A virtual-time loop passes
    its own `loop.time` as `now`, so that the time read agrees with the timers."""

    __slots__ = ("now",)

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        # An attribute, not a method: `clock.now()` costs what the bare function costs.
        self.now = now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def within(self, aw: Awaitable[T], seconds: float) -> T:
        async with asyncio.timeout(seconds):
            return await aw

    def call_later(self, seconds: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(seconds, callback)
