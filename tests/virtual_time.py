"""Tests of timers on the virtual-time loop (fleetgate/simulate/loop.py): its clock starts at
0 and, whenever nothing is ready to run, jumps to the next timer instead of waiting for it. An
hour of sleeps takes microseconds; the order and the times of everything are those real time
would give.

    @in_virtual_time
    async def test_something(clock: LoopClock, tmp_path: Path) -> None:
        ...  # clock: the lifecycle's Clock on the loop; other arguments are pytest's fixtures

Work handed to threads (`asyncio.to_thread`: file writes) takes no virtual time: while any
runs, the loop waits for it without jumping. Sockets still work (the loop polls them before
each jump) but do not hold time back: a test in virtual time should not wait for the network.
With no timer left and nothing ready, the loop blocks on I/O as any loop would
(pytest-timeout ends a test stuck that way).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable, Coroutine
from typing import Any

from fleetgate.clock import LoopClock
from fleetgate.simulate.loop import VirtualTimeLoop

REAL_BUDGET_S = 0.5  # the real time a test in virtual time may take


def run(main: Callable[[LoopClock], Coroutine[Any, Any, None]]) -> float:
    """Run `main(clock)` on a fresh virtual-time loop; the real seconds it took."""
    started = time.perf_counter()
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, VirtualTimeLoop)
        runner.run(main(loop.clock()))
    return time.perf_counter() - started


def in_virtual_time(
    test: Callable[..., Coroutine[Any, Any, None]],
) -> Callable[..., None]:
    """A test run on a virtual-time loop, given its Clock as `clock` (and its other fixtures
    as pytest gives them), which must take under REAL_BUDGET_S of real time however many
    virtual seconds it covers."""
    signature = inspect.signature(test)

    @functools.wraps(test)
    def wrapper(**fixtures: Any) -> None:
        real_s = run(lambda clock: test(clock=clock, **fixtures))
        assert real_s < REAL_BUDGET_S, f"{test.__name__} took {real_s:.3f} s of real time"

    # pytest reads the fixtures a test asks for from its signature: all but `clock`.
    others = [p for name, p in signature.parameters.items() if name != "clock"]
    wrapper.__signature__ = signature.replace(parameters=others)  # type: ignore[attr-defined]
    return wrapper
