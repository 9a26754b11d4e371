"""Jittered periodic work per backend (health probes, metrics scrapes): one task each, drawn
intervals so that a fleet's probes do not all land at once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

from fleetgate.clock import Clock


class PeriodicTasks:
    def __init__(self, rng: random.Random, clock: Clock) -> None:
        self._rng = rng
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()

    def every(
        self,
        interval_s: float,
        jitter: float,
        action: Callable[[], Awaitable[None]],
        *,
        wait_first: bool,
    ) -> Callable[[], None]:
        """Run `action` every interval_s * U(1 - jitter, 1 + jitter) until `stop()`, or until
        the function returned is called (it stops this one alone)."""

        async def loop() -> None:
            if not wait_first:
                await action()
            while True:
                await self._clock.sleep(interval_s * self._rng.uniform(1 - jitter, 1 + jitter))
                await action()

        task = asyncio.get_running_loop().create_task(loop())
        self._tasks.add(task)

        def cancel() -> None:
            task.cancel()
            self._tasks.discard(task)

        return cancel

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
