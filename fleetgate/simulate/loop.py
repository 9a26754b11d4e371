"""An event loop in virtual time: its clock starts at 0 and, whenever nothing is ready to run,
jumps to the next timer instead of waiting for it. An hour of sleeps takes microseconds; the
order and the times of everything are those real time would give. The simulator runs the
gateway's own code on it; tests of timers do too (tests/virtual_time.py).

Work handed to threads (`asyncio.to_thread`: file writes) takes no virtual time: while any
runs, the loop waits for it without jumping. With `io=True` sockets still work (the loop polls
them before each jump) but do not hold time back; with `io=False` (the simulator: nothing of
it is on a network) the loop never asks the kernel, and a wait with no timer left and nothing
ready is a deadlock, raised as one. Timers due at the same time run in the order they were
set.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar, TypeVarTuple

from fleetgate.clock import LoopClock

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class Deadlock(RuntimeError):
    """Everything waits and no timer is left: nothing could ever run again."""


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """Its own timer heap of (when, order, handle) tuples: equal times run in the order they
    were set, and the heap compares floats, not handles (a fifth of a simulation's time went
    to `TimerHandle.__lt__` on the base loop's heap)."""

    def __init__(self, io: bool = True) -> None:
        self._now = 0.0
        self._threads = 0  # executor jobs not yet done: time stands still for them
        self._io = io
        self._timers: list[tuple[float, int, asyncio.TimerHandle]] = []
        self._order = itertools.count()
        self._cancelled_timers = 0
        super().__init__()

    def time(self) -> float:
        return self._now

    def call_at(
        self, when: float, callback: Callable[[*Ts], object], *args: *Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:  # fmt: skip
        self._check_closed()  # type: ignore[attr-defined]
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        if handle._scheduled:  # type: ignore[attr-defined]
            self._cancelled_timers += 1

    def _run_once(self) -> None:
        """One turn: run what is ready; when nothing is, jump to the next timer (or wait for
        I/O or a thread, which is all that could wake it when no timer is left)."""
        timers, ready = self._timers, self._ready  # type: ignore[attr-defined]
        self._drop_cancelled()
        if ready or self._stopping:  # type: ignore[attr-defined]
            timeout: float | None = 0.0
        else:
            timeout = timers[0][0] - self._now if timers else None
        if timeout is None or (timeout > 0 and self._threads):
            if not self._io and not self._threads:
                raise Deadlock("every task waits and no timer is left")
            self._poll(None)  # only I/O can wake the loop (a thread's end does)
        elif self._io or self._threads:
            self._poll(0)
        if timers and not ready and not self._stopping:  # type: ignore[attr-defined]
            self._now = max(self._now, timers[0][0])
        end = self._now + self._clock_resolution  # type: ignore[attr-defined]
        while timers and timers[0][0] < end:
            handle = heapq.heappop(timers)[2]
            handle._scheduled = False  # type: ignore[attr-defined]
            if handle._cancelled:
                self._cancelled_timers -= 1
            else:
                ready.append(handle)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()

    def _poll(self, timeout: float | None) -> None:
        self._process_events(self._selector.select(timeout))  # type: ignore[attr-defined]

    def _drop_cancelled(self) -> None:
        """Cancelled timers off the heap: from its head, or all at once when they are most of
        it (as the base loop does)."""
        timers = self._timers
        if self._cancelled_timers > 100 and self._cancelled_timers * 2 > len(timers):
            kept = []
            for entry in timers:
                if entry[2]._cancelled:
                    entry[2]._scheduled = False  # type: ignore[attr-defined]
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            self._timers[:] = kept
            self._cancelled_timers = 0
        while timers and timers[0][2]._cancelled:
            heapq.heappop(timers)[2]._scheduled = False  # type: ignore[attr-defined]
            self._cancelled_timers -= 1

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
