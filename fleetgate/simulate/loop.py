"""An event loop in virtual time: its clock starts at 0 and, whenever nothing is ready to run,
jumps to the next timer instead of waiting for it. An hour of sleeps takes microseconds; the
order and the times of everything are those real time would give. The simulator runs the
gateway's own code on it; tests of timers do too (tests/virtual_time.py).

Work handed to threads (`asyncio.to_thread`: file writes) takes no virtual time: while any
runs, the loop waits for it without jumping. With `io=True` sockets still work (the loop polls
them before each jump) but do not hold time back; with `io=False` (the simulator: nothing of
it is on a network) the loop never asks the kernel, and a wait with no timer left and nothing
ready is a deadlock, raised as one.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar, TypeVarTuple

from fleetgate.clock import LoopClock

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class Deadlock(RuntimeError):
    """Everything waits and no timer is left: nothing could ever run again."""


class _JumpingSelector(selectors.DefaultSelector):
    """Polls instead of blocking (`io`), or not at all; when nothing is ready, tells the loop
    to jump over the wait (the loop's `_run_once` asks for exactly the time to its next
    timer)."""

    def __init__(self, jump: Callable[[float], None], threads: Callable[[], int], io: bool) -> None:
        super().__init__()
        self._jump = jump
        self._threads = threads
        self._io = io

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or (timeout > 0 and self._threads()):
            if not self._io and not self._threads():
                raise Deadlock("every task waits and no timer is left")
            return super().select(None)  # only I/O can wake the loop (a thread's end does)
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0) if self._io else []
        if not ready and timeout > 0:
            self._jump(timeout)
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, io: bool = True) -> None:
        self._now = 0.0
        self._threads = 0  # executor jobs not yet done: time stands still for them
        super().__init__(_JumpingSelector(self._jump, lambda: self._threads, io))

    def time(self) -> float:
        return self._now

    def _jump(self, seconds: float) -> None:
        self._now += seconds

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*Ts], T], *args: *Ts
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self._threads += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _: object) -> None:
        self._threads -= 1

    def clock(self) -> LoopClock:
        """The lifecycle's Clock on this loop: the loop's timers, read on its virtual time."""
        return LoopClock(self.time)
