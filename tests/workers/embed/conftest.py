"""What the batcher's tests drive it with: a clock that moves only when told, and a model whose
batches end only when told."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

GUARD_S = 5.0  # a test that waits longer than this for an event has failed


class ManualClock:
    """Virtual time for the batcher: `advance` moves it and wakes the sleeps that are due;
    `next_sleep` waits for the batcher to go to sleep and says until when."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleeps: asyncio.Queue[float] = asyncio.Queue()
        self._timers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        timer = (self.now + seconds, asyncio.get_running_loop().create_future())
        self._timers.append(timer)
        self._sleeps.put_nowait(timer[0])
        try:
            await timer[1]
        finally:
            self._timers.remove(timer)

    async def next_sleep(self) -> float:
        """The time at which the next sleep the batcher starts (from now on) ends."""
        while not self._sleeps.empty():
            self._sleeps.get_nowait()  # from before: not the one asked for
        return await asyncio.wait_for(self._sleeps.get(), GUARD_S)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for due, future in self._timers:
            if due <= self.now and not future.done():
                future.set_result(None)


@dataclass
class Batch:
    items: list[str]
    done: asyncio.Future[list[str]] = field(repr=False)

    def finish(self) -> None:
        self.done.set_result([item.upper() for item in self.items])


class FakeModel:
    """`run_batch` for the batcher: each batch waits until the test finishes it; its results
    are the items in capitals."""

    def __init__(self) -> None:
        self._batches: asyncio.Queue[Batch] = asyncio.Queue()

    async def __call__(self, items: list[str]) -> list[str]:
        batch = Batch(items, asyncio.get_running_loop().create_future())
        self._batches.put_nowait(batch)
        return await batch.done

    async def next(self) -> Batch:
        """The next batch the batcher starts."""
        return await asyncio.wait_for(self._batches.get(), GUARD_S)

    def idle(self) -> bool:
        return self._batches.empty()
