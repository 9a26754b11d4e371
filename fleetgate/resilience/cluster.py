"""A cluster (Envoy's word): a pool and the policies for reaching it."""

from __future__ import annotations

from dataclasses import dataclass

from fleetgate.fleet.pool import Pool
from fleetgate.lifecycle.hooks import Emitters
from fleetgate.resilience.hedge import HedgeSettings, TtftWindow
from fleetgate.resilience.retry import RetryBudget, RetrySettings
from fleetgate.routing.router import Router
from fleetgate.traffic.admission import Admission
from fleetgate.upstream.prefill import Prefill
from fleetgate.upstream.timeouts import Timeouts


@dataclass(frozen=True, slots=True)
class Cluster:
    """How a pool is routed, how long its backends are waited on, how a failure is retried or
    hedged, and the emitters whose subscribers hear its requests' events (built in the
    composition root: fleetgate/serve.py)."""

    router: Router
    timeouts: Timeouts
    retries: RetrySettings
    budget: RetryBudget
    hedge: HedgeSettings
    ttft: TtftWindow  # the recent TTFTs the hedge delay is taken from
    emit: Emitters
    prefill: Prefill | None = None  # disaggregated: the prefill half's backends
    admission: Admission | None = None  # its queue when saturated (None: admission off)
    engine_priority: bool = False  # each request is sent with its class as `priority`

    @property
    def pool(self) -> Pool:
        return self.router.pool

    @property
    def model(self) -> str:
        return self.router.pool.model
