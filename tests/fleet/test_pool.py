"""A pool: candidates follow health, in-flight counts follow begin/end, every policy routing
over it (a Router) keeps up."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.pool import Pool
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.registry import default_registry
from fleetgate.routing.router import Router

MakeRouter = Callable[[str, Sequence[float]], Router]
REQUEST = RoutingRequest("m", "chat", stream=True)
POLICIES = default_registry().picker_names


def test_candidates_are_the_healthy_states_and_keep_their_identity(
    make_router: MakeRouter,
) -> None:
    pool = make_router("round_robin", [1, 1, 1]).pool
    assert pool.candidates == pool.states
    assert pool.ready
    before = pool.candidates
    pool.begin(
        pool.states[0].backend.id, 0.0
    )  # load changes leave the tuple alone: indexes stay valid
    assert pool.candidates is before
    pool.states[1].flags = HealthFlag.ACTIVE_CHECK_FAILED
    assert pool.candidates is before  # only refresh() recomputes them
    pool.refresh(0.0)
    assert pool.candidates == (pool.states[0], pool.states[2])


def test_no_healthy_backend_means_not_ready_yet_panic_routes_to_all(
    make_router: MakeRouter,
) -> None:
    router = make_router("least_requests", [1, 1])
    pool = router.pool
    for state in pool.states:
        state.flags = HealthFlag.ACTIVE_CHECK_FAILED
    pool.refresh(0.0)
    assert not pool.ready
    assert router.pick(REQUEST, 0.0) in pool.states  # below the panic threshold: all of them
    for state in pool.states:
        state.flags = HealthFlag.DRAINING
    pool.refresh(0.0)
    assert router.pick(REQUEST, 0.0) is None  # but never to backends leaving on purpose


def test_begin_and_end_count_requests() -> None:
    state = BackendState(Backend("b0", "http://127.0.0.1:8100", ("m",), 2.0))
    pool = Pool("m", [state])
    load = pool.board.load("b0")  # its counts are on the pool's board, by id
    assert (load.in_flight, state.weight) == (0, 2.0)
    pool.begin(state.backend.id, 0.0)
    pool.begin(state.backend.id, 0.0)
    pool.end(state.backend.id, 0.0)
    assert (load.in_flight, pool.in_flight) == (1, 1)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_drops_an_unhealthy_backend_and_takes_it_back(
    policy: str, make_router: MakeRouter
) -> None:
    router = make_router(policy, [1, 2, 1, 1])
    pool = router.pool
    rng = random.Random(3)
    in_flight: list[BackendState] = []

    def serve(count: int, start: float) -> Counter[BackendState]:
        picks: Counter[BackendState] = Counter()
        for t in range(count):
            chosen = router.pick(REQUEST, start + t)
            assert chosen is not None
            pool.begin(chosen.backend.id, 0.0)
            in_flight.append(chosen)
            picks[chosen] += 1
            if len(in_flight) > 6:  # requests finish out of order, removed backend included
                pool.end(in_flight.pop(rng.randrange(len(in_flight))).backend.id, 0.0)
        return picks

    assert set(serve(200, 0.0)) == set(pool.states)
    gone = pool.states[1]
    gone.flags = HealthFlag.ACTIVE_CHECK_FAILED
    pool.refresh(0.0)
    during = serve(400, 200.0)
    assert gone not in during
    assert set(during) == set(pool.candidates)
    gone.flags = HealthFlag(0)
    pool.refresh(0.0)
    assert gone in serve(200, 600.0)
    for state in in_flight:
        pool.end(state.backend.id, 0.0)
    assert all(load.in_flight == 0 for _, load in pool.loads())


def test_prompt_tokens_wait_for_prefill_from_begin_to_the_first_token(
    make_router: MakeRouter,
) -> None:
    pool = make_router("least_requests", [1]).pool
    state = pool.states[0]
    load = pool.board.load(state.backend.id)
    pool.begin(state.backend.id, 0.0, prompt_tokens=500)
    pool.begin(state.backend.id, 0.0, prompt_tokens=300)
    assert load.pending_prefill == 800
    pool.board.prefilled(state.backend.id, 500)  # the first request's first token came back
    assert load.pending_prefill == 300
    pool.end(state.backend.id, 1.0)  # ...and it ended: nothing more to release
    pool.end(state.backend.id, 1.0, unprefilled=300)  # the second failed before its first token
    assert (load.pending_prefill, load.in_flight) == (0, 0)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_routes_to_a_backend_added_and_not_to_one_retired(
    policy: str, make_router: MakeRouter
) -> None:
    router = make_router(policy, [1, 1])
    pool = router.pool
    left: list[BackendState] = []
    pool.left = left.append
    added = BackendState(Backend("b2", "http://127.0.0.1:8102", ("m",), 1.0))
    pool.add(added, 0.0)
    picks: Counter[BackendState] = Counter()
    for t in range(300):
        chosen = router.pick(REQUEST, float(t))
        assert chosen is not None
        pool.begin(chosen.backend.id, 0.0)  # loads change as they do in traffic
        picks[chosen] += 1
    for state, count in picks.items():
        for _ in range(count):
            pool.end(state.backend.id, 0.0)
    assert set(picks) == set(pool.states) and added in picks
    busy = pool.states[0]
    pool.begin(
        busy.backend.id, 0.0
    )  # a request in flight there: it finishes before the backend leaves
    assert not pool.retire(busy, 1.0)
    assert pool.retiring(busy) and busy in pool.states and busy.flags == HealthFlag.GONE
    for state in pool.states:  # panic (all unhealthy) still never routes to it
        if state is not busy:
            state.flags = HealthFlag.ACTIVE_CHECK_FAILED
    pool.refresh(1.0)
    assert busy not in {router.pick(REQUEST, 2.0 + t) for t in range(50)}
    assert left == []
    pool.end(busy.backend.id, 3.0)
    assert left == [busy] and busy not in pool.states and not pool.retiring(busy)
    idle = pool.states[0]
    assert pool.retire(idle, 4.0)  # nothing in flight: it leaves at once
    assert left == [busy, idle] and pool.states == (added,)


def test_a_new_weight_keeps_the_measured_speed_and_the_slow_start_share() -> None:
    state = BackendState(Backend("b0", "http://127.0.0.1:8100", ("m",), 2.0))
    pool = Pool("m", [state])
    changed: list[BackendState] = []
    pool.load_changed = changed.append
    state.speed, state.weight = 0.5, 0.5  # 2.0 x speed 0.5 x half way up its slow start
    pool.set_weight(state, 4.0, 0.0)
    assert (state.backend.weight, state.weight, changed) == (4.0, 1.0, [state])
    assert state.backend.url == "http://127.0.0.1:8100" and state.backend.origin.port == 8100
