"""What the gateway learns of the simulated engines from outside, on the intervals it would
learn it live: their load, as its metrics scraper reads it (fleet/scraper.py), straight from
the engine model instead of through Prometheus text. Live, each backend is scraped on its own
jittered interval; here a pool's backends are read together, once an interval (jittered), so
an hour of 1,000 replicas costs one timer an interval, not a thousand. Health probes go through
the virtual transport as they are (health/active.py): a replica that is up answers them."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

from fleetgate.clock import Clock
from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.engine_load import EngineLoad
from fleetgate.fleet.load_board import LoadBoard
from fleetgate.fleet.periodic import PeriodicTasks
from fleetgate.fleet.scraper import MetricsScraper, ScrapeSettings
from fleetgate.http.client import Origin
from fleetgate.http.transport import Transport
from fleetgate.simulate.replica import SimBackend


class SimScraper(MetricsScraper):
    """The metrics scraper, reading the simulated engines a pool at a time."""

    def __init__(self, client: Transport, clock: Clock, rng: random.Random,
                 backends: Mapping[Origin, SimBackend]) -> None:  # fmt: skip
        super().__init__(client, clock, rng)
        self._backends = backends
        self._ticks = PeriodicTasks(rng, clock)
        # (the board, the settings) -> the backends read together; a backend -> its group
        self._groups: dict[tuple[LoadBoard, ScrapeSettings], list[BackendState]] = {}
        self._group_of: dict[BackendState, list[BackendState]] = {}

    def start(
        self, states: Iterable[BackendState], settings: ScrapeSettings, board: LoadBoard
    ) -> None:
        if not settings.enabled:
            return
        key = (board, settings)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = []

            async def tick() -> None:
                now = self._now()
                for state in list(group):
                    self._read(state, board, now)

            self._ticks.every(settings.interval_s, settings.jitter, tick, wait_first=False)
        for state in states:
            group.append(state)
            self._group_of[state] = group

    def forget(self, state: BackendState) -> None:
        group = self._group_of.pop(state, None)
        if group is not None:
            group.remove(state)

    def stop(self) -> None:
        self._ticks.stop()
        self._groups.clear()
        self._group_of.clear()

    async def scrape(self, state: BackendState, s: ScrapeSettings, board: LoadBoard) -> bool:
        return self._read(state, board, self._now())

    def _read(self, state: BackendState, board: LoadBoard, now: float) -> bool:
        """One reading of `state`'s engine into `state.engine`; False when it is down."""
        backend = self._backends.get(state.backend.origin)
        if backend is None or not backend.up:
            return False  # no answer: the last reading goes stale
        load = backend.engine.load(now)
        totals = load.step_totals
        state.engine = EngineLoad(
            running=load.running, waiting=load.waiting, kv_usage=load.kv_usage,
            prefix_hits=load.prefix_hits, prefix_queries=load.prefix_queries, hit_rate=None,
            scraped_at=now, kv_capacity_tokens=backend.engine.profile.kv_capacity_tokens,
            sent_tokens=board.load(state.backend.id).in_flight_tokens, step_totals=totals,
        )  # fmt: skip
        state.step_fit.add(totals)
        return True
