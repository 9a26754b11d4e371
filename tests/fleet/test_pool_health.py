"""A pool's candidates as health changes over (injected) time: ejection (by the outlier
detector, through the pool) and return with slow start, backpressure backoff, and the panic
threshold; picks go through the pool's Router."""

from __future__ import annotations

import random

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.health import HealthFlag, HealthSettings
from fleetgate.fleet.pool import Pool
from fleetgate.health.outlier import OutlierDetector, OutlierSettings
from fleetgate.lifecycle.events import AttemptEnded
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.registry import PluginContext, default_registry
from fleetgate.routing.router import Router

REQUEST = RoutingRequest("m", "chat", False)


def make(n: int, panic: float = 0.5, slow_start_s: float = 10.0) -> Router:
    states = [
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{9000 + i}", ("m",))) for i in range(n)
    ]
    health = HealthSettings(panic_threshold=panic, slow_start_s=slow_start_s)
    pool = Pool("m", states, health)
    ctx = PluginContext(random.Random(0), pool.board)
    return Router(pool, default_registry().build_pipeline("least_requests", {}, ctx))


def detector_of(pool: Pool) -> OutlierDetector:
    return OutlierDetector(OutlierSettings(consecutive_failures=2, base_ejection_s=5.0), pool)


def ended(state: BackendState, at: float, status: int, retry_after_s: float | None) -> AttemptEnded:
    """An attempt's end at `state` with this answer (no transport error)."""
    return AttemptEnded(
        b"r", at, "m", state.backend.id, "first", sent_at=at, prompt_tokens=1, queued_prefill=0,
        status=status, error=None, retry_after_s=retry_after_s, first_token_at=None,
        output_tokens=0, stream=False,
    )  # fmt: skip


def test_an_ejected_backend_leaves_the_candidates_and_returns_with_slow_start() -> None:
    router = make(4)
    pool = router.pool
    detector = detector_of(pool)
    bad = pool.states[0]
    assert not detector.failure(bad, 0.0)
    assert detector.failure(bad, 0.0)
    assert bad.flags == HealthFlag.EJECTED
    assert bad not in pool.candidates
    assert all(router.pick(REQUEST, t / 10) is not bad for t in range(40))
    router.pick(REQUEST, 5.0)  # its ejection is over: back, at a tenth of its weight
    assert bad in pool.candidates
    assert bad.weight == 0.1
    router.pick(REQUEST, 10.0)
    assert 0.4 < bad.weight < 0.6
    router.pick(REQUEST, 15.0)
    assert bad.weight == 1.0
    assert bad.ramp_from is None


def test_backpressure_skips_a_backend_until_its_retry_after_without_ejecting_it() -> None:
    router = make(3)
    pool = router.pool
    detector = detector_of(pool)
    busy = pool.states[1]
    for _ in range(3):  # more 429s than the failures in a row that would eject it
        detector.on_attempt_ended(ended(busy, 0.0, 429, 2.0))
    assert busy.healthy
    assert busy not in pool.candidates
    assert detector.ejections(busy) == 0
    router.pick(REQUEST, 2.0)
    assert busy in pool.candidates


def test_when_every_backend_backs_off_they_are_still_candidates() -> None:
    pool = make(2).pool
    for state in pool.states:
        pool.backpressure(state, 0.0, 5.0)
    assert set(pool.candidates) == set(pool.states)  # better a busy backend than a 503


def test_panic_below_the_threshold_routes_across_the_whole_pool() -> None:
    pool = make(4, panic=0.5).pool
    for state in pool.states[:3]:
        state.flags = HealthFlag.ACTIVE_CHECK_FAILED
    pool.refresh(0.0)
    assert set(pool.candidates) == set(pool.states)  # 1 of 4 healthy < 50%
    assert pool.ready
    no_panic = make(4, panic=0.0).pool
    for state in no_panic.states[:3]:
        state.flags = HealthFlag.ACTIVE_CHECK_FAILED
    no_panic.refresh(0.0)
    assert no_panic.candidates == (no_panic.states[3],)


def test_a_retry_avoids_the_backends_already_tried() -> None:
    router = make(3)
    first = router.pick(REQUEST, 0.0)
    assert first is not None
    second = router.pick_other(REQUEST, 0.0, [first])
    assert second is not None
    assert second is not first
    assert router.pick_other(REQUEST, 0.0, router.pool.states) is None


def test_a_backend_at_its_concurrency_limit_is_skipped_until_one_finishes() -> None:
    states = [
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{9000 + i}", ("m",), max_in_flight=2))
        for i in range(2)
    ]
    pool = Pool("m", states)
    ctx = PluginContext(random.Random(0), pool.board)
    router = Router(pool, default_registry().build_pipeline("round_robin", {}, ctx))
    picked = []
    for _ in range(4):
        state = router.pick(REQUEST, 0.0)
        assert state is not None
        pool.begin(state.backend.id, 0.0)
        picked.append(state)
    assert sorted(load.in_flight for _, load in pool.loads()) == [2, 2]
    assert router.pick(REQUEST, 0.0) is None  # every backend full: the gateway answers 503
    pool.end(states[0].backend.id, 1.0)
    assert router.pick(REQUEST, 1.0) is states[0]
