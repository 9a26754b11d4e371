"""Reads each backend's engine metrics (GET /metrics) on an interval into its live state.

One task per backend, jittered like the health checks; a failed or unparseable scrape leaves
the last reading to go stale rather than inventing one. A backend whose engine is `auto` is
first recognised (fleet/engines.py): its `/v1/models`, then what `/metrics` exports, then
Ollama's `/api/version`; probed again on each interval until one answers. An engine that
exports no load metrics (Ollama, a generic OpenAI server) is not scraped after that.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import replace

from fleetgate.clock import Clock
from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.engine_load import MetricsFormatError, parse_engine_load
from fleetgate.fleet.engines import ENGINES, PENDING, by_metrics, by_models
from fleetgate.fleet.load_board import LoadBoard
from fleetgate.fleet.periodic import PeriodicTasks
from fleetgate.http.errors import UpstreamError
from fleetgate.http.transport import Transport
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
        client: Transport,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self._client = client
        self._now = clock.now
        self._tasks = PeriodicTasks(rng, clock)
        self._scraping: dict[BackendState, Callable[[], None]] = {}

    def start(
        self, states: Iterable[BackendState], settings: ScrapeSettings, board: LoadBoard
    ) -> None:
        """Scrape each of `states` (counted on `board`, their pool's) on its own jittered
        interval until `stop()` (with scraping off, only recognise each `auto` one, until it
        is)."""
        if not settings.enabled:
            for state in states:
                if state.kind is PENDING:
                    self._recognise_only(state, settings)
            return
        for state in states:

            async def scrape(state: BackendState = state) -> None:
                await self.scrape(state, settings, board)

            self._scraping[state] = self._tasks.every(
                settings.interval_s, settings.jitter, scrape, wait_first=False
            )

    def _recognise_only(self, state: BackendState, settings: ScrapeSettings) -> None:
        async def recognise() -> None:
            await self.recognise(state, settings)
            if state.kind is not PENDING:
                self.forget(state)

        self._scraping[state] = self._tasks.every(
            settings.interval_s, settings.jitter, recognise, wait_first=False
        )

    def forget(self, state: BackendState) -> None:
        """Stop scraping `state` (it left its pool)."""
        stop = self._scraping.pop(state, None)
        if stop is not None:
            stop()

    def stop(self) -> None:
        self._tasks.stop()
        self._scraping.clear()

    async def scrape(self, state: BackendState, s: ScrapeSettings, board: LoadBoard) -> bool:
        """One scrape into `state.engine`, noting beside the reading the prompt tokens in
        flight to it on `board` then (routing/load.py `kv_usages`); True when it gave a
        reading."""
        if state.kind is PENDING:
            await self.recognise(state, s)
        if not state.kind.metrics:
            return False
        answer = await self._get(state, s.path, s.timeout_s)
        if answer is None:
            return False
        body = answer[1]
        try:
            load = parse_engine_load(body.decode("utf-8", "replace"), self._now())
        except MetricsFormatError:
            return False
        if load is None:
            return False
        sent = board.load(state.backend.id).in_flight_tokens
        state.engine = replace(load, sent_tokens=sent)
        if load.step_totals is not None:
            state.step_fit.add(load.step_totals)
        return True

    async def recognise(self, state: BackendState, s: ScrapeSettings) -> None:
        """Set `state.kind` from what the backend says of itself (left PENDING while it does
        not answer)."""
        timeout = s.timeout_s
        listing = await self._get(state, "/v1/models", timeout)
        kind = None if listing is None else by_models(listing[1], listing[0])
        if kind is None and (metrics := await self._get(state, s.path, timeout)) is not None:
            kind = by_metrics(metrics[1])
        if kind is None and await self._get(state, "/api/version", timeout) is not None:
            kind = "ollama"
        if kind is None and listing is not None:
            kind = "openai"  # it lists models: OpenAI-compatible, nothing more is known
        if kind is not None:
            state.kind = ENGINES[kind]

    async def _get(
        self, state: BackendState, path: str, timeout_s: float
    ) -> tuple[bytes | None, bytes] | None:
        """A 200 answer's Server header and body, or None."""
        try:
            response = await self._client.request(
                state.backend.origin, b"GET", path.encode(), list(state.backend.credentials),
                timeout_s=timeout_s,
            )  # fmt: skip
            response.expire_in(timeout_s, f"GET {path} timed out")
            body = await response.read()
        except UpstreamError:
            return None
        return (response.header(b"server"), body) if response.status == 200 else None
