"""Jittered periodic work per backend (health probes, metrics scrapes): one task each, drawn
intervals so that a fleet's probes do not all land at once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable


class PeriodicTasks:
    def __init__(
        self, rng: random.Random, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> None:
        self._rng = rng
        self._sleep = sleep
        self._tasks: list[asyncio.Task[None]] = []

    def every(
        self,
        interval_s: float,
        jitter: float,
        action: Callable[[], Awaitable[None]],
        *,
        wait_first: bool,
    ) -> None:
        """Run `action` every interval_s * U(1 - jitter, 1 + jitter) until `stop()`."""

        async def loop() -> None:
            if not wait_first:
                await action()
            while True:
                await self._sleep(interval_s * self._rng.uniform(1 - jitter, 1 + jitter))
                await action()

        self._tasks.append(asyncio.get_running_loop().create_task(loop()))

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
