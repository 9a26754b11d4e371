"""What the gateway learns of the simulated engines from outside, on the intervals it would
learn it live: their load, as its metrics scraper reads it (fleet/scraper.py), straight from
the engine model instead of through Prometheus text (the same reading, without rendering and
parsing it on every interval of every backend). Health probes go through the virtual
transport as they are (health/active.py): a replica that is up answers them."""

from __future__ import annotations

import random
from collections.abc import Mapping

from fleetgate.clock import Clock
from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.engine_load import EngineLoad
from fleetgate.fleet.load_board import LoadBoard
from fleetgate.fleet.scraper import MetricsScraper, ScrapeSettings
from fleetgate.http.client import Origin
from fleetgate.http.transport import Transport
from fleetgate.simulate.fleet import SimBackend


class SimScraper(MetricsScraper):
    """The metrics scraper, reading the simulated engines."""

    def __init__(self, client: Transport, clock: Clock, rng: random.Random,
                 backends: Mapping[Origin, SimBackend]) -> None:  # fmt: skip
        super().__init__(client, clock, rng)
        self._backends = backends

    async def scrape(self, state: BackendState, s: ScrapeSettings, board: LoadBoard) -> bool:
        backend = self._backends.get(state.backend.origin)
        if backend is None or not backend.up:
            return False  # no answer: the last reading goes stale
        now = self._now()
        backend.settle(now)
        load = backend.engine.load()
        totals = load.step_totals
        state.engine = EngineLoad(
            running=load.running, waiting=load.waiting, kv_usage=load.kv_usage,
            prefix_hits=load.prefix_hits, prefix_queries=load.prefix_queries, hit_rate=None,
            scraped_at=now, kv_capacity_tokens=backend.engine.profile.kv_capacity_tokens,
            sent_tokens=board.load(state.backend.id).in_flight_tokens, step_totals=totals,
        )  # fmt: skip
        state.step_fit.add(totals)
        return True
