"""Reads each backend's engine metrics (GET /metrics) on an interval into its live state.

One task per backend, jittered like the health checks; a failed or unparseable scrape leaves
the last reading to go stale rather than inventing one.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace

from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.engine_load import MetricsFormatError, parse_engine_load
from fleetgate.fleet.periodic import PeriodicTasks
from fleetgate.http.client import HttpClient
from fleetgate.http.errors import UpstreamError
from fleetgate.settings import Settings, jitter, positive_seconds


class ScrapeSettings(Settings, frozen=True):
    """A pool's `engine_metrics:` section."""

    enabled: bool = True  # read each backend's engine metrics
    path: str = "/metrics"  # where the engine serves them (Prometheus text)
    interval_s: float = 1.0  # between two scrapes of one backend
    jitter: float = 0.2  # intervals drawn from interval_s * (1 +- jitter)
    timeout_s: float = 1.0  # a slower scrape is abandoned
    stale_after_s: float = 5.0  # a reading older than this is not trusted by routing

    def __post_init__(self) -> None:
        positive_seconds("interval_s", self.interval_s)
        jitter("jitter", self.jitter)
        positive_seconds("timeout_s", self.timeout_s)
        positive_seconds("stale_after_s", self.stale_after_s)


class MetricsScraper:
    def __init__(
        self,
        client: HttpClient,
        clock: Callable[[], float],
        rng: random.Random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._client = client
        self._clock = clock
        self._tasks = PeriodicTasks(rng, sleep)
        self._scraping: dict[BackendState, Callable[[], None]] = {}

    def start(self, states: Iterable[BackendState], settings: ScrapeSettings) -> None:
        """Scrape each of `states` on its own jittered interval until `stop()`."""
        if not settings.enabled:
            return
        for state in states:

            async def scrape(state: BackendState = state) -> None:
                await self.scrape(state, settings)

            self._scraping[state] = self._tasks.every(
                settings.interval_s, settings.jitter, scrape, wait_first=False
            )

    def forget(self, state: BackendState) -> None:
        """Stop scraping `state` (it left its pool)."""
        stop = self._scraping.pop(state, None)
        if stop is not None:
            stop()

    def stop(self) -> None:
        self._tasks.stop()
        self._scraping.clear()

    async def scrape(self, state: BackendState, s: ScrapeSettings) -> bool:
        """One scrape into `state.engine`; True when it gave a reading."""
        try:
            response = await self._client.request(
                state.backend.origin, b"GET", s.path.encode(), [], timeout_s=s.timeout_s
            )
            response.expire_in(s.timeout_s, "metrics scrape timed out")
            body = await response.read()
        except UpstreamError:
            return False
        if response.status != 200:
            return False
        try:
            load = parse_engine_load(body.decode("utf-8", "replace"), self._clock())
        except MetricsFormatError:
            return False
        if load is None:
            return False
        state.engine = replace(load, sent_tokens=state.in_flight_tokens)
        if load.step_totals is not None:
            state.step_fit.add(load.step_totals)
        return True
