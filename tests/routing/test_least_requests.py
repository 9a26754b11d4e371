"""`least_requests`: argmin (in_flight + 1) / weight: slow backends get less, weights count."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from fleetgate.fleet.health import HealthFlag
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.router import Router

MakeRouter = Callable[[str, Sequence[float]], Router]
RunTraffic = Callable[[Router, Mapping[str, int], int, int], tuple[Counter[str], dict[str, float]]]
REQUEST = RoutingRequest("m", "chat", stream=True)


def test_a_five_times_slower_backend_gets_a_small_share(
    make_router: MakeRouter, traffic: RunTraffic
) -> None:
    # Fixed service times, so a backend's throughput is in_flight / service time. Balancing
    # in-flight counts sends the slow one 1/5 of a fast one's share: 1/16 of the traffic with
    # three fast peers, where round robin would send it 1/4.
    router = make_router("least_requests", [1, 1, 1, 1])
    picks, in_flight = traffic(router, {"b0": 20, "b1": 4, "b2": 4, "b3": 4}, 2, 5000)
    total = picks.total()
    assert 0.04 < picks["b0"] / total < 0.10
    for fast in ("b1", "b2", "b3"):
        assert 0.28 < picks[fast] / total < 0.33
    # ... because its queue stays close to the others' instead of growing 5x as long.
    assert in_flight["b0"] < 1.5 * in_flight["b1"]


def test_weights_three_to_one_at_equal_speed_hold_three_to_one_in_flight(
    make_router: MakeRouter, traffic: RunTraffic
) -> None:
    router = make_router("least_requests", [3, 1])
    picks, in_flight = traffic(router, {"b0": 10, "b1": 10}, 4, 3000)
    assert 2.9 < in_flight["b0"] / in_flight["b1"] < 3.1
    assert 2.9 < picks["b0"] / picks["b1"] < 3.1


def test_every_pick_is_a_least_loaded_backend_as_loads_change(make_router: MakeRouter) -> None:
    # The heap behind the O(1) pick must track every begin/end, whatever their order.
    router = make_router("least_requests", [1, 2, 0.5, 1, 3])
    pool = router.pool
    rng = random.Random(5)
    for t in range(5000):
        chosen = router.pick(REQUEST, float(t))
        assert chosen is not None
        in_flight = {s: load.in_flight for s, load in pool.loads()}
        least = min((in_flight[s] + 1) / s.weight for s in pool.states)
        assert (in_flight[chosen] + 1) / chosen.weight == least, t
        busy = [s for s in pool.states if in_flight[s]]
        if busy and rng.random() < 0.5:
            pool.end(rng.choice(busy).backend.id, 0.0)
        else:
            pool.begin((chosen if rng.random() < 0.8 else rng.choice(pool.states)).backend.id, 0.0)


def test_equal_idle_backends_take_turns(make_router: MakeRouter) -> None:
    # Requests that finish before the next arrives leave every load equal: ties go to the
    # backend whose load changed longest ago, so each round visits every backend once.
    router = make_router("least_requests", [1, 1, 1, 1])
    pool = router.pool
    sequence = []
    for t in range(40):
        chosen = router.pick(REQUEST, float(t))
        assert chosen is not None
        pool.begin(chosen.backend.id, 0.0)
        pool.end(chosen.backend.id, 0.0)
        sequence.append(chosen)
    for start in range(0, 40, 4):
        assert set(sequence[start : start + 4]) == set(pool.states)


def test_a_removed_backend_finishing_late_requests_is_not_picked(make_router: MakeRouter) -> None:
    router = make_router("least_requests", [1, 1, 1])
    pool = router.pool
    gone = pool.states[0]
    for _ in range(3):
        pool.begin(gone.backend.id, 0.0)
    gone.flags = HealthFlag.ACTIVE_CHECK_FAILED
    pool.refresh(0.0)
    for t in range(30):
        chosen = router.pick(REQUEST, float(t))
        assert chosen is not None
        assert chosen is not gone
        pool.begin(chosen.backend.id, 0.0)
        if pool.board.load(gone.backend.id).in_flight:
            pool.end(
                gone.backend.id, 0.0
            )  # its old requests finish while it is out of the candidates
    # Back in, idle while the others are loaded: it is the least loaded one.
    gone.flags = HealthFlag(0)
    pool.refresh(0.0)
    assert router.pick(REQUEST, 30.0) is gone
