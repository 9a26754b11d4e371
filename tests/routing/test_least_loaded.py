"""least_loaded: engine-reported queue and KV use, the gateway's own count between scrapes."""

from __future__ import annotations

import random

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.engine_load import EngineLoad
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.least_loaded import LeastLoaded
from fleetgate.routing.max_score import MaxScore
from fleetgate.routing.registry import PluginContext, default_registry

REQUEST = RoutingRequest("m", "chat", True)


def states(n: int) -> list[BackendState]:
    return [
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{9000 + i}", ("m",))) for i in range(n)
    ]


def load(running: float, waiting: float, kv: float, at: float = 0.0) -> EngineLoad:
    return EngineLoad(running, waiting, kv, 0.0, 0.0, None, at)


def test_the_engine_with_the_shortest_queue_and_emptiest_cache_scores_best() -> None:
    a, b, c = states(3)
    a.engine, b.engine, c.engine = load(8, 4, 0.9), load(2, 0, 0.2), load(6, 0, 0.5)
    scores = LeastLoaded().score(REQUEST, [a, b, c], 1.0)
    assert scores[1] > scores[2] > scores[0]
    assert all(0.0 <= s <= 1.0 for s in scores)


def test_requests_sent_since_the_scrape_count_and_stale_readings_do_not() -> None:
    a, b = states(2)
    a.engine, b.engine = load(0, 0, 0.1), load(0, 0, 0.1)
    a.in_flight = 5  # sent since the last scrape, which still says idle
    scores = LeastLoaded().score(REQUEST, [a, b], 1.0)
    assert scores[1] > scores[0]
    a.in_flight, b.engine = 0, load(50, 50, 1.0, at=-100.0)  # b's reading is stale
    scores = LeastLoaded(stale_after_s=5.0).score(REQUEST, [a, b], 1.0)
    assert scores[0] == scores[1]  # neither is known to be busier


def test_max_score_shares_ties_at_random_and_takes_a_clear_best() -> None:
    pool = states(3)
    picker = MaxScore(random.Random(0))
    picks = {picker.pick(REQUEST, pool, [0.5, 0.5, 0.1], 0.0).backend.id for _ in range(50)}
    assert picks == {"b0", "b1"}
    assert picker.pick(REQUEST, pool, [0.1, 0.9, 0.5], 0.0) is pool[1]


def test_the_least_loaded_profile_routes_to_the_idle_engine() -> None:
    registry = default_registry()
    assert "least_loaded" in registry.policy_names
    pipeline = registry.build_pipeline("least_loaded", {}, PluginContext(random.Random(1)))
    a, b = states(2)
    a.engine, b.engine = load(10, 10, 0.8), load(1, 0, 0.1)
    assert all(pipeline.pick(REQUEST, [a, b], 0.5) is b for _ in range(20))
