"""Self-calibrating weights: shares follow measured speed, throttling lowers them."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.calibration import FLOOR, WeightSettings, speed_factors
from fleetgate.fleet.pool import Pool
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.registry import PluginContext, default_registry

REQUEST = RoutingRequest("m", "chat", True)


def states(n: int) -> list[BackendState]:
    return [
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",))) for i in range(n)
    ]


def streamed(state: BackendState, tpot_s: float, answers: int = 10) -> None:
    for _ in range(answers):
        state.latency.record_stream(0.05, 0.05 + tpot_s * 100, tokens=101)


def test_factors_are_speeds_relative_to_the_fastest_once_enough_answers_are_seen() -> None:
    h100, a100, new, throttled = states(4)
    streamed(h100, 0.01)
    streamed(a100, 0.02)
    streamed(new, 0.01, answers=3)  # too few to trust
    streamed(throttled, 1.0)
    factors = speed_factors([h100, a100, new, throttled], WeightSettings())
    assert factors == pytest.approx([1.0, 0.5, 1.0, FLOOR])
    assert speed_factors([h100, new], WeightSettings()) == [1.0, 1.0]  # one known: no scale


def pool_of(backends: list[BackendState], **settings: object) -> Pool:
    pipeline = default_registry().build_pipeline(
        "least_requests", {}, PluginContext(random.Random(0))
    )
    return Pool("m", backends, pipeline, weights=WeightSettings(**settings))  # type: ignore[arg-type]


def routed(pool: Pool, now: float, n: int = 300) -> Counter[str]:
    picks: Counter[str] = Counter()
    held = []
    for _ in range(n):
        state = pool.pick(REQUEST, now)
        assert state is not None
        pool.begin(state, now)
        held.append(state)
        picks[state.backend.id] += 1
    for state in held:
        pool.end(state, now)
    return picks


def test_a_faster_backend_gets_more_after_calibration_and_a_throttled_one_less() -> None:
    fast, slow = states(2)
    pool = pool_of([fast, slow], enabled=True, interval_s=10.0)
    streamed(fast, 0.01)
    streamed(slow, 0.02)
    assert routed(pool, 1.0) == {"b0": 150, "b1": 150}  # before the first calibration
    shares = routed(pool, 10.0)
    assert (fast.weight, slow.weight) == pytest.approx((1.0, 0.5))
    assert shares["b0"] == pytest.approx(200, abs=2)  # in flight per weight: 2 to 1
    streamed(fast, 0.08)  # thermal throttling: its per-token time climbs
    routed(pool, 20.0, n=1)
    assert fast.weight < slow.weight == 1.0


def test_calibration_is_opt_in_and_off_keeps_typed_weights() -> None:
    fast, slow = states(2)
    pool = pool_of([fast, slow])
    streamed(fast, 0.01)
    streamed(slow, 0.02)
    assert routed(pool, 100.0) == {"b0": 150, "b1": 150}
    assert fast.weight == slow.weight == 1.0
