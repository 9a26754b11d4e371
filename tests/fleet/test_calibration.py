"""Self-calibrating weights: shares follow the engines' fitted speed, throttling lowers them."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.calibration import FLOOR, WeightSettings, speed_factors
from fleetgate.fleet.engine_load import StepTotals
from fleetgate.fleet.pool import Pool
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.registry import PluginContext, default_registry
from fleetgate.routing.router import Router

REQUEST = RoutingRequest("m", "chat", True)


def states(n: int) -> list[BackendState]:
    return [
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",))) for i in range(n)
    ]


def measured(state: BackendState, c: float, intervals: int = 12) -> None:
    """Scrapes of an engine (restarted) whose steps take 5 ms + c per token, of 100 to 1,200
    tokens."""
    totals = StepTotals(0, 0, 0, 0)
    state.step_fit.add(totals)
    for i in range(intervals):
        x = 100 + 100 * (i % 12)
        steps, gaps = 10, 80
        totals = StepTotals(
            totals.steps + steps, totals.tokens + steps * x,
            totals.gaps + gaps, totals.gap_s + gaps * (0.005 + c * x),
        )  # fmt: skip
        state.step_fit.add(totals)


def test_factors_are_speeds_relative_to_the_fastest_once_enough_intervals_are_seen() -> None:
    h100, a100, new, throttled = states(4)
    measured(h100, 1e-5)
    measured(a100, 2e-5)
    measured(new, 1e-5, intervals=3)  # too few to trust
    measured(throttled, 1e-3)
    factors = speed_factors([h100, a100, new, throttled], WeightSettings())
    assert factors == pytest.approx([1.0, 0.5, 1.0, FLOOR])
    assert speed_factors([h100, new], WeightSettings()) == [1.0, 1.0]  # one known: no scale


def router_of(backends: list[BackendState], **settings: object) -> Router:
    pipeline = default_registry().build_pipeline(
        "least_requests", {}, PluginContext(random.Random(0))
    )
    pool = Pool("m", backends, weights=WeightSettings(**settings))
    return Router(pool, pipeline)


def routed(router: Router, now: float, n: int = 300) -> Counter[str]:
    pool = router.pool
    picks: Counter[str] = Counter()
    held = []
    for _ in range(n):
        state = router.pick(REQUEST, now)
        assert state is not None
        pool.begin(state, now)
        held.append(state)
        picks[state.backend.id] += 1
    for state in held:
        pool.end(state, now)
    return picks


def test_a_faster_backend_gets_more_after_calibration_and_a_throttled_one_less() -> None:
    fast, slow = states(2)
    router = router_of([fast, slow], calibrate=True, interval_s=10.0)
    measured(fast, 1e-5)
    measured(slow, 2e-5)
    assert routed(router, 1.0) == {"b0": 150, "b1": 150}  # before the first calibration
    shares = routed(router, 10.0)
    assert (fast.weight, slow.weight) == pytest.approx((1.0, 0.5))
    assert shares["b0"] == pytest.approx(200, abs=2)  # in flight per weight: 2 to 1
    measured(fast, 8e-5, intervals=60)  # thermal throttling: its steps take longer
    routed(router, 20.0, n=1)
    assert fast.weight < slow.weight == 1.0


def test_calibration_is_on_by_default_and_off_keeps_typed_weights() -> None:
    assert WeightSettings().calibrate
    fast, slow = states(2)
    router = router_of([fast, slow], calibrate=False)
    measured(fast, 1e-5)
    measured(slow, 2e-5)
    assert routed(router, 100.0) == {"b0": 150, "b1": 150}
    assert fast.weight == slow.weight == 1.0
