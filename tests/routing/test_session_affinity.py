"""`session_affinity`: consistent hashing with bounded loads. A session stays on its home; no
backend carries more than ceil((1 + epsilon) * (L + 1) / n); a backend leaving moves only the
sessions it was home to."""

from __future__ import annotations

import math
import random
from collections import Counter

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.fleet.pool import Pool
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import CandidateLoads
from fleetgate.routing.registry import PluginContext, default_registry
from fleetgate.routing.router import Router
from fleetgate.routing.session_affinity import SessionAffinity

KEYS = [f"user-{i}" for i in range(2000)]


def states(n: int) -> tuple[BackendState, ...]:
    return tuple(
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",))) for i in range(n)
    )


def of_session(key: str | None) -> RoutingRequest:
    return RoutingRequest("m", "chat", True, session_key=key)


def session_router(n: int, seed: int = 1) -> Router:
    """A pool of n backends routed by the shipped `session_affinity` profile."""
    pool = Pool("m", states(n))
    ctx = PluginContext(random.Random(seed), pool.board)
    return Router(pool, default_registry().build_pipeline("session_affinity", {}, ctx))


def scorer_of() -> SessionAffinity:
    """The scorer alone, over a board with nothing in flight."""
    return SessionAffinity(CandidateLoads(MemoryLoadBoard()))


def test_the_same_session_scores_one_on_the_same_backend_every_time() -> None:
    scorer = scorer_of()
    candidates = states(6)
    for key in ("alice", "bob", "carol"):
        first = scorer.score(of_session(key), candidates, 0.0)
        assert sorted(first) == [0.0] * 5 + [1.0]
        for t in range(10):
            assert scorer.score(of_session(key), candidates, float(t)) == first


def test_without_a_session_key_every_score_is_zero() -> None:
    assert scorer_of().score(of_session(None), states(4), 0.0) == [0.0] * 4


def test_sessions_are_spread_over_the_backends() -> None:
    scorer = scorer_of()
    candidates = states(8)
    homes = Counter(scorer.home(key, candidates) for key in KEYS)
    assert set(homes) == set(candidates)
    assert max(homes.values()) < 2 * len(KEYS) / len(candidates)


def test_no_backend_carries_more_than_the_bound_even_under_one_hot_session() -> None:
    epsilon, n = 0.25, 8
    router = session_router(n)
    pool = router.pool
    rng = random.Random(5)
    in_flight: list[BackendState] = []
    hot_homes: Counter[BackendState] = Counter()
    for step in range(3000):
        # Most traffic from one session, the rest from many; about a third finish each step.
        hot = rng.random() < 0.7
        key = "hot" if hot else f"user-{rng.randrange(500)}"
        total = pool.in_flight
        state = router.pick(of_session(key), float(step))
        assert state is not None
        pool.begin(state.backend.id, float(step))
        in_flight.append(state)
        bound = math.ceil((1 + epsilon) * (total + 1) / n)
        carries = pool.board.load(state.backend.id).in_flight
        assert carries <= bound, f"step {step}: {state} carries {carries}, over {bound}"
        hot_homes[state] += hot
        for _ in range(rng.choice((0, 1, 2))):
            if in_flight:
                pool.end(in_flight.pop(rng.randrange(len(in_flight))).backend.id, float(step))
    # The bound did its work: the hot session overflowed from its home to the next backends.
    assert len(+hot_homes) > 1


def test_a_backend_leaving_moves_only_the_sessions_it_was_home_to() -> None:
    scorer = scorer_of()
    candidates = states(10)
    before = {key: scorer.home(key, candidates) for key in KEYS}
    gone = candidates[3]
    remaining = candidates[:3] + candidates[4:]
    after = {key: scorer.home(key, remaining) for key in KEYS}
    moved = [key for key in KEYS if after[key] is not before[key]]
    assert moved == [key for key in KEYS if before[key] is gone]
    assert len(moved) > 0
    # They go to the next point clockwise, which differs from key to key: no single heir.
    heirs = Counter(after[key] for key in moved)
    assert gone not in heirs and len(heirs) >= 5
    # And when it comes back, the same sessions return to it.
    assert {key: scorer.home(key, candidates) for key in KEYS} == before


def test_the_profile_keeps_sessions_sticky() -> None:
    router = session_router(8)
    pool = router.pool
    homes: dict[str, set[BackendState]] = {}
    rng = random.Random(3)
    for step in range(400):
        key = f"conversation-{rng.randrange(40)}"
        state = router.pick(of_session(key), float(step))
        assert state is not None
        pool.begin(state.backend.id, float(step))
        homes.setdefault(key, set()).add(state)
        pool.end(state.backend.id, float(step) + 0.5)
    assert all(len(h) == 1 for h in homes.values())
    assert len({next(iter(h)) for h in homes.values()}) >= 6  # and still spread


def test_the_profile_keeps_sessions_sticky_in_a_pool_larger_than_the_shortlist() -> None:
    # With 256 backends the pipeline scores a shortlist of 16; a session's home must not move
    # when a backend not seen before is first scored.
    router = session_router(256)
    homes: dict[str, set[BackendState]] = {}
    for turn in range(5):
        for s in range(50):
            key = f"conversation-{s}"
            state = router.pick(of_session(key), float(turn))
            assert state is not None
            homes.setdefault(key, set()).add(state)
    moved = sorted(key for key, h in homes.items() if len(h) > 1)
    assert moved == []


def test_a_backend_joining_takes_no_session_the_table_knows() -> None:
    # On the ring alone about a ninth of the sessions would move to a ninth backend, away from
    # their KV caches; those the session table has seen stay where their last request went.
    router = session_router(8)
    pool = router.pool
    keys = KEYS[:300]
    homes = {key: router.pick(of_session(key), 0.0) for key in keys}
    joined = BackendState(Backend("b8", "http://127.0.0.1:8108", ("m",)))
    pool.add(joined, 1.0)
    assert {key: router.pick(of_session(key), 2.0) for key in keys} == homes
    ring_alone = scorer_of()  # a table of its own, empty: the ring decides
    assert any(ring_alone.home(key, pool.candidates) is joined for key in keys)
    # A new session may go to it.
    assert joined in {router.pick(of_session(key), 3.0) for key in KEYS[300:]}
