"""An event loop in virtual time, for tests of timers: its clock starts at 0 and, whenever
nothing is ready to run, jumps to the next timer instead of waiting for it. An hour of sleeps
takes microseconds; the order and the times of everything are those real time would give.

    @in_virtual_time
    async def test_something(clock: LoopClock) -> None: ...  # clock: the lifecycle's Clock

I/O still works (the loop polls it without blocking before each jump), but it does not hold
time back: a test in virtual time should not wait for real sockets or threads. With no timer
left and nothing ready, the loop blocks on I/O as any loop would (pytest-timeout ends a
test stuck that way).
"""

from __future__ import annotations

import asyncio
import functools
import selectors
import time
from collections.abc import Callable, Coroutine
from typing import Any

from fleetgate.clock import LoopClock

REAL_BUDGET_S = 0.5  # the real time a test in virtual time may take


class _JumpingSelector(selectors.DefaultSelector):
    """Polls instead of blocking; when nothing is ready, tells the loop to jump over the wait
    (the loop's `_run_once` asks for exactly the time to its next timer)."""

    def __init__(self, jump: Callable[[float], None]) -> None:
        super().__init__()
        self._jump = jump

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:  # no timer at all: only I/O can wake the loop
            return super().select(None)
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if not ready and timeout > 0:
            self._jump(timeout)
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_JumpingSelector(self._jump))

    def time(self) -> float:
        return self._now

    def _jump(self, seconds: float) -> None:
        self._now += seconds

    def clock(self) -> LoopClock:
        """The lifecycle's Clock on this loop: the loop's timers, read on its virtual time."""
        return LoopClock(self.time)


def run(main: Callable[[LoopClock], Coroutine[Any, Any, None]]) -> float:
    """Run `main(clock)` on a fresh virtual-time loop; the real seconds it took."""
    started = time.perf_counter()
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, VirtualTimeLoop)
        runner.run(main(loop.clock()))
    return time.perf_counter() - started


def in_virtual_time(
    test: Callable[[LoopClock], Coroutine[Any, Any, None]],
) -> Callable[[], None]:
    """A test run on a virtual-time loop (given its Clock), which must take under
    REAL_BUDGET_S of real time however many virtual seconds it covers."""

    @functools.wraps(test)
    def wrapper() -> None:
        real_s = run(test)
        assert real_s < REAL_BUDGET_S, f"{test.__name__} took {real_s:.3f} s of real time"

    del wrapper.__wrapped__  # pytest must see no `clock` argument
    return wrapper
