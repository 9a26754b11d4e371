"""A Director over one pool, built as the composition root builds it (serve.build_clusters),
its transport a mock and every event, edge and pool, recorded: no HTTP anywhere."""

from __future__ import annotations

import random
from collections.abc import Sequence

from fleetgate.clock import Clock
from fleetgate.config import PoolConfig
from fleetgate.director import Director
from fleetgate.director.cache import ResponseCache
from fleetgate.fleet.backend import Backend
from fleetgate.http.mock import MockTransport
from fleetgate.lifecycle.events import Event
from fleetgate.lifecycle.hooks import Emitters, Hooks
from fleetgate.resilience.continuation import Continuation
from fleetgate.resilience.failover import Failover
from fleetgate.routing.registry import default_registry
from fleetgate.serve import ResolvedPool, build_clusters
from fleetgate.upstream.attempt import Attempts


def director_over(
    pool: PoolConfig,
    backends: Sequence[Backend],
    transport: MockTransport,
    clock: Clock,
    events: list[Event],
    cache: ResponseCache | None = None,
) -> Director:
    def record(hooks: Hooks) -> None:
        hooks.subscribe(Event, events.append)

    clusters = build_clusters(
        [ResolvedPool(pool, tuple(backends))], default_registry(), random.Random(1),
        transport=transport, clock=clock, subscribe=record,
    )  # fmt: skip
    attempts = Attempts(transport, clock.now)
    failover = Failover(attempts, Continuation(attempts, clock.now), clock, random.Random(2))
    edge = Hooks()
    record(edge)
    return Director(
        clusters=clusters, failover=failover, emit=Emitters(edge), clock=clock.now, cache=cache
    )
