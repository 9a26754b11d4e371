"""The virtual-time loop (tests/virtual_time.py) cannot be fooled: an hour of sleep takes
milliseconds and moves its clock by an hour, timers fire in order at their times, and the
lifecycle's Clock on it reads that time."""

from __future__ import annotations

import asyncio
import time

import pytest

from fleetgate.clock import LoopClock
from tests.virtual_time import in_virtual_time, run


def test_an_hour_of_sleep_takes_milliseconds_and_moves_the_clock_by_an_hour() -> None:
    seen: list[float] = []

    async def main(clock: LoopClock) -> None:
        loop = asyncio.get_running_loop()
        before = (loop.time(), clock.now())
        await clock.sleep(3600)
        seen.extend([*before, loop.time(), clock.now()])

    real_s = run(main)
    assert seen == [0.0, 0.0, 3600.0, 3600.0]
    assert real_s < 0.1


@in_virtual_time
async def test_timers_fire_in_order_at_their_virtual_times(clock: LoopClock) -> None:
    fired: list[tuple[str, float]] = []

    async def after(name: str, delay: float) -> None:
        await clock.sleep(delay)
        fired.append((name, clock.now()))

    clock.call_later(2.5, lambda: fired.append(("later", clock.now())))
    await asyncio.gather(after("c", 30.0), after("a", 0.25), after("b", 1.0))
    assert fired == [("a", 0.25), ("b", 1.0), ("later", 2.5), ("c", 30.0)]


@in_virtual_time
async def test_within_gives_the_answer_in_time_and_times_out_at_the_deadline(
    clock: LoopClock,
) -> None:
    async def answer(after_s: float) -> str:
        await clock.sleep(after_s)
        return "yes"

    assert await clock.within(answer(9.0), 10.0) == "yes"
    assert clock.now() == 9.0
    slow = asyncio.ensure_future(answer(100.0))
    with pytest.raises(TimeoutError):
        await clock.within(slow, 10.0)
    assert clock.now() == 19.0 and slow.cancelled()  # gave up at its deadline, cancelled it


def test_the_clock_is_the_loop_s_virtual_one_not_the_wall_s() -> None:
    async def main(clock: LoopClock) -> None:
        real = time.monotonic()
        await clock.sleep(86_400 * 7)  # a week, in steps the loop caps at a day each
        assert clock.now() == 86_400 * 7
        assert time.monotonic() - real < 0.1

    run(main)


@in_virtual_time
async def test_work_in_a_thread_takes_no_virtual_time(clock: LoopClock) -> None:
    ticks: list[float] = []

    async def tick() -> None:
        while True:
            await clock.sleep(1.0)
            ticks.append(clock.now())

    ticker = asyncio.ensure_future(tick())
    await asyncio.to_thread(sum, range(2_000_000))  # real work: the ticker must not run ahead
    assert clock.now() == 0.0 and ticks == []
    await clock.sleep(2.5)
    assert ticks == [1.0, 2.0]
    ticker.cancel()


@in_virtual_time
async def test_timers_of_one_time_run_in_the_order_set_and_cancelled_ones_leave(
    clock: LoopClock,
) -> None:
    loop = asyncio.get_running_loop()
    fired: list[int] = []
    for i in range(5):
        loop.call_at(7.0, fired.append, i)
    doomed = [loop.call_at(100.0 + i, fired.append, -1) for i in range(1000)]
    for timer in doomed:
        timer.cancel()
    await clock.sleep(8.0)
    assert fired == [0, 1, 2, 3, 4] and clock.now() == 8.0
    assert len(loop._timers) < 100  # type: ignore[attr-defined]  # swept, not kept until due
    await clock.sleep(200.0)
    assert fired == [0, 1, 2, 3, 4]
