"""The dynamic batcher, on a clock and a model the tests move by hand."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from fleetgate.workers.embed.batcher import (
    Batcher,
    BatchingSettings,
    BatchRun,
    Overloaded,
    plan_batch,
)
from tests.workers.embed.conftest import GUARD_S, FakeModel, ManualClock

MakeBatcher = Callable[..., Batcher[str, str]]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def model() -> FakeModel:
    return FakeModel()


@pytest.fixture
async def make(clock: ManualClock, model: FakeModel) -> AsyncIterator[MakeBatcher]:
    """`make(**settings)`: a started batcher over the fake model and the manual clock."""
    made: list[Batcher[str, str]] = []

    def build(**settings: object) -> Batcher[str, str]:
        batcher = Batcher(BatchingSettings(**settings), model, clock, clock.sleep)  # type: ignore[arg-type]
        batcher.start()
        made.append(batcher)
        return batcher

    yield build
    for batcher in made:
        await batcher.stop()


async def result(future: asyncio.Future[list[str]]) -> list[str]:
    return await asyncio.wait_for(future, GUARD_S)


@pytest.mark.parametrize(
    ("settings", "waiting", "waited_ms", "size"),
    [
        ({}, 1, 0.0, 1),  # defaults: no delay, so whatever waits goes
        ({}, 40, 0.0, 32),  # never more than max_batch_size
        ({"max_queue_delay_ms": 5.0}, 3, 4.9, 0),  # waits for company...
        ({"max_queue_delay_ms": 5.0}, 3, 5.0, 3),  # ...until the oldest has waited the delay
        ({"max_queue_delay_ms": 5.0, "max_batch_size": 4}, 4, 0.0, 4),  # a full batch goes
        ({"preferred_batch_sizes": (4, 8), "max_queue_delay_ms": 5.0}, 4, 0.0, 4),
        ({"preferred_batch_sizes": (4, 8), "max_queue_delay_ms": 5.0}, 7, 0.0, 4),  # trimmed
        ({"preferred_batch_sizes": (4, 8), "max_queue_delay_ms": 5.0}, 12, 0.0, 8),
        ({"preferred_batch_sizes": (4, 8), "max_queue_delay_ms": 5.0}, 3, 1.0, 0),
        ({"preferred_batch_sizes": (4, 8), "max_queue_delay_ms": 5.0}, 3, 6.0, 3),
    ],
)
def test_plan(settings: dict[str, object], waiting: int, waited_ms: float, size: int) -> None:
    config = BatchingSettings(**settings)  # type: ignore[arg-type]
    assert plan_batch(config, waiting, waited_ms / 1000.0) == size


async def test_a_lone_request_on_an_idle_model_runs_at_once(
    make: MakeBatcher, model: FakeModel
) -> None:
    batcher = make()
    future = batcher.submit(["a"], 1)
    batch = await model.next()
    assert batch.items == ["a"]
    batch.finish()
    assert await result(future) == ["A"]


async def test_under_load_the_next_batch_takes_all_that_arrived_up_to_the_maximum(
    make: MakeBatcher, model: FakeModel
) -> None:
    batcher = make(max_batch_size=4)
    first = batcher.submit(["a"], 1)
    running = await model.next()
    later = [batcher.submit([c], 1) for c in "bcdefg"]  # arrive while the model is busy
    assert (batcher.waiting_items, batcher.running_items) == (6, 1)
    running.finish()
    second = await model.next()
    assert second.items == ["b", "c", "d", "e"]  # oldest first, as many as the maximum
    second.finish()
    third = await model.next()
    assert third.items == ["f", "g"]
    third.finish()
    assert await result(first) == ["A"]
    assert [await result(f) for f in later] == [[c.upper()] for c in "bcdefg"]


async def test_a_request_of_many_inputs_is_many_items_answered_in_order(
    make: MakeBatcher, model: FakeModel
) -> None:
    batcher = make(max_batch_size=2)
    future = batcher.submit(["a", "b", "c", "d", "e"], 1)
    sizes = []
    for _ in range(3):
        batch = await model.next()
        sizes.append(len(batch.items))
        batch.finish()
    assert sizes == [2, 2, 1]
    assert await result(future) == ["A", "B", "C", "D", "E"]


async def test_items_wait_up_to_the_delay_for_a_preferred_size(
    make: MakeBatcher, model: FakeModel, clock: ManualClock
) -> None:
    batcher = make(max_queue_delay_ms=10.0, preferred_batch_sizes=(4,))
    batcher.submit(["a"], 1)
    assert await clock.next_sleep() == pytest.approx(0.010)
    clock.advance(0.004)
    batcher.submit(["b", "c"], 1)
    assert await clock.next_sleep() == pytest.approx(0.010)  # the oldest's delay still counts
    assert model.idle()
    clock.advance(0.006)
    assert (await model.next()).items == ["a", "b", "c"]


async def test_a_preferred_size_goes_without_waiting_out_the_delay(
    make: MakeBatcher, model: FakeModel, clock: ManualClock
) -> None:
    batcher = make(max_queue_delay_ms=10.0, preferred_batch_sizes=(2, 4))
    batcher.submit(["a"], 1)
    await clock.next_sleep()
    batcher.submit(["b", "c", "d", "e"], 1)  # 5 waiting: the largest preferred size is 4
    assert (await model.next()).items == ["a", "b", "c", "d"]
    assert batcher.waiting_items == 1


async def test_higher_priority_items_go_into_the_next_batch_first(
    make: MakeBatcher, model: FakeModel
) -> None:
    batcher = make(max_batch_size=2)
    batcher.submit(["first"], 1)
    running = await model.next()
    for text, priority in (("shed", 2), ("std1", 1), ("crit", 0), ("std2", 1), ("top", -5)):
        batcher.submit([text], priority)
    running.finish()
    second = await model.next()
    assert second.items == ["top", "crit"]  # the lowest number first, as vLLM orders them
    second.finish()
    assert (await model.next()).items == ["std1", "std2"]  # equals in arrival order


async def test_an_item_waiting_past_its_timeout_fails_its_request(
    make: MakeBatcher, model: FakeModel, clock: ManualClock
) -> None:
    batcher = make(queue_timeout_ms=1000.0, max_batch_size=1)
    batcher.submit(["busy"], 1)
    running = await model.next()
    patient = batcher.submit(["a"], 1)
    hurried = batcher.submit(["b"], 1, timeout_s=0.2)  # a header may shorten it
    assert await clock.next_sleep() == pytest.approx(0.2)
    clock.advance(0.2)
    with pytest.raises(Overloaded) as refused:
        await result(hurried)
    assert refused.value.code == "queue_timeout"
    assert "limit of 200 ms" in refused.value.message
    assert refused.value.retry_after_s >= 1
    assert await clock.next_sleep() == pytest.approx(1.0)
    clock.advance(0.8)
    with pytest.raises(Overloaded):
        await result(patient)
    assert (batcher.waiting_items, batcher.waiting_requests) == (0, 0)
    running.finish()


async def test_a_request_partly_run_still_fails_when_its_last_items_time_out(
    make: MakeBatcher, model: FakeModel, clock: ManualClock
) -> None:
    batcher = make(queue_timeout_ms=1000.0, max_batch_size=2)
    future = batcher.submit(["a", "b", "c"], 1)
    running = await model.next()
    assert running.items == ["a", "b"]
    clock.advance(1.0)
    with pytest.raises(Overloaded):
        await result(future)  # "c" waited too long while a and b ran
    running.finish()  # their results go nowhere


async def test_a_full_queue_refuses_a_request_whole(make: MakeBatcher, model: FakeModel) -> None:
    batcher = make(max_queue_items=3)
    batcher.submit(["busy"], 1)
    await model.next()
    batcher.submit(["a", "b"], 1)
    with pytest.raises(Overloaded) as refused:
        batcher.submit(["c", "d"], 1)
    assert refused.value.code == "queue_full"
    assert batcher.waiting_items == 2
    batcher.submit(["e"], 1)  # what fits still goes in


async def test_a_request_given_up_leaves_the_queue(make: MakeBatcher, model: FakeModel) -> None:
    batcher = make()
    batcher.submit(["busy"], 1)
    running = await model.next()
    gone = batcher.submit(["a", "b"], 1)
    stays = batcher.submit(["c"], 1)
    gone.cancel()  # what a client's disconnect does to the handler awaiting it
    await asyncio.sleep(0)  # a future's done-callbacks run on the loop's next turn
    assert (batcher.waiting_items, batcher.waiting_requests) == (1, 1)
    running.finish()
    nxt = await model.next()
    assert nxt.items == ["c"]
    nxt.finish()
    assert await result(stays) == ["C"]


async def test_items_of_requests_given_up_do_not_pile_up_behind_the_queue_bound(
    make: MakeBatcher, model: FakeModel
) -> None:
    batcher = make(max_queue_items=8, max_batch_size=4)
    batcher.submit(["busy"], 1)
    running = await model.next()
    for _ in range(50):  # low-priority requests whose clients leave while the model is busy
        gone = batcher.submit(["x"] * 8, 9)
        gone.cancel()
        await asyncio.sleep(0)
    assert batcher.waiting_items == 0
    assert len(batcher._items) <= 2 * 0 + 4 + 8  # compacted, not 400 dead items
    running.finish()


async def test_a_failing_model_fails_its_batch_and_the_batcher_goes_on(clock: ManualClock) -> None:
    calls = 0

    async def flaky(items: list[str]) -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("model broke")
        return items

    batcher: Batcher[str, str] = Batcher(BatchingSettings(), flaky, clock, clock.sleep)
    batcher.start()
    try:
        with pytest.raises(RuntimeError, match="model broke"):
            await result(batcher.submit(["a"], 1))
        assert await result(batcher.submit(["b"], 1)) == ["b"]
    finally:
        await batcher.stop()


async def test_retry_after_is_the_queue_over_the_measured_drain_rate(clock: ManualClock) -> None:
    runs: list[BatchRun] = []
    model = FakeModel()
    batcher: Batcher[str, str] = Batcher(
        BatchingSettings(max_batch_size=4), model, clock, clock.sleep, runs.append
    )
    batcher.start()
    try:
        assert batcher.retry_after_s() == 1.0  # nothing measured yet
        first = batcher.submit(["a", "b", "c", "d"], 1)
        running = await model.next()
        for _ in range(10):
            batcher.submit(["x"], 1)
        clock.advance(2.0)  # 4 items in 2 s: 2 items/s
        running.finish()
        await result(first)
        assert runs == [BatchRun(items=4, requests=1, seconds=2.0, queue_waits_s=(0.0,))]
        assert batcher.retry_after_s() == 3.0  # 6 still waiting after the next 4 went
    finally:
        await batcher.stop()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"preferred_batch_sizes": (8, 4)}, "increasing"),
        ({"preferred_batch_sizes": (64,)}, "preferred_batch_sizes"),
        ({"max_queue_delay_ms": -1.0}, "max_queue_delay_ms"),
        ({"queue_timeout_ms": 0.0}, "queue_timeout_ms"),
    ],
)
def test_settings_are_checked(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BatchingSettings(**settings)  # type: ignore[arg-type]
