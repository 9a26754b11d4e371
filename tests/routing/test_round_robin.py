"""`round_robin`: every candidate in turn, exactly evenly, whatever the candidate set is now."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.round_robin import RoundRobin
from fleetgate.routing.router import Router

REQUEST = RoutingRequest("m", "chat", stream=False)
MakeRouter = Callable[[str, Sequence[float]], Router]


def states(n: int) -> tuple[BackendState, ...]:
    return tuple(
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",))) for i in range(n)
    )


def test_k_rounds_give_each_backend_exactly_k_picks() -> None:
    for seed in range(5):
        for n in (1, 2, 3, 7):
            candidates = states(n)
            picker = RoundRobin(random.Random(seed))
            k = 50
            counts = Counter(picker.pick(REQUEST, candidates, None, 0.0) for _ in range(k * n))
            assert counts == dict.fromkeys(candidates, k), (seed, n)


def test_picks_follow_the_candidate_order_from_a_seeded_start() -> None:
    candidates = states(4)
    picker = RoundRobin(random.Random(7))
    picks = [picker.pick(REQUEST, candidates, None, float(t)) for t in range(12)]
    start = candidates.index(picks[0])
    assert picks == [candidates[(start + i) % 4] for i in range(12)]


def test_the_first_backend_depends_on_the_seed() -> None:
    candidates = states(8)
    firsts = {
        RoundRobin(random.Random(seed)).pick(REQUEST, candidates, None, 0.0) for seed in range(40)
    }
    assert len(firsts) > 1  # gateways started together do not all begin on one backend


def test_in_a_pool_load_does_not_change_the_turns(make_router: MakeRouter) -> None:
    router = make_router("round_robin", [1.0, 1.0, 1.0])
    pool = router.pool
    busy = pool.states[0]
    for _ in range(10):
        pool.begin(busy.backend.id, 0.0)  # a loaded backend still gets its turn
    counts = Counter(router.pick(REQUEST, float(t)) for t in range(30))
    assert counts == dict.fromkeys(pool.states, 10)
