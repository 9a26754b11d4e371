"""`power_of_two`: the less loaded of two random candidates; avoids slow and full backends."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import CandidateLoads
from fleetgate.routing.power_of_two import PowerOfTwo
from fleetgate.routing.router import Router

MakeRouter = Callable[[str, Sequence[float]], Router]
RunTraffic = Callable[[Router, Mapping[str, int], int, int], tuple[Counter[str], dict[str, float]]]
REQUEST = RoutingRequest("m", "chat", stream=True)


def states(weights: Sequence[float]) -> tuple[BackendState, ...]:
    return tuple(
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",), w))
        for i, w in enumerate(weights)
    )


def relative(board: MemoryLoadBoard, state: BackendState) -> float:
    return (board.load(state.backend.id).in_flight + 1) / state.weight


def test_a_five_times_slower_backend_gets_a_small_share(
    make_router: MakeRouter, traffic: RunTraffic
) -> None:
    # Same traffic as least_requests' test: round robin or random would send the slow backend
    # 1/4; two choices send it about a third of that.
    router = make_router("power_of_two", [1, 1, 1, 1])
    picks, in_flight = traffic(router, {"b0": 20, "b1": 4, "b2": 4, "b3": 4}, 2, 5000)
    total = picks.total()
    assert picks["b0"] / total < 0.12
    for fast in ("b1", "b2", "b3"):
        assert picks[fast] / total > 0.28
    assert in_flight["b0"] < 2 * in_flight["b1"]


def test_weights_count_in_the_comparison(make_router: MakeRouter, traffic: RunTraffic) -> None:
    router = make_router("power_of_two", [3, 1, 3, 1])
    picks, in_flight = traffic(router, dict.fromkeys(("b0", "b1", "b2", "b3"), 10), 4, 3000)
    heavy = picks["b0"] + picks["b2"]
    light = picks["b1"] + picks["b3"]
    assert 2.4 < heavy / light < 3.1
    assert in_flight["b0"] > 2.4 * in_flight["b1"]


def test_never_picks_the_single_most_loaded_backend() -> None:
    # Whatever pair is drawn, the most loaded member of it loses.
    candidates = states((1, 2, 1, 0.5, 1))
    rng = random.Random(9)
    board = MemoryLoadBoard()
    picker = PowerOfTwo(random.Random(4), CandidateLoads(board))
    for t in range(3000):
        for state in candidates:
            board.load(state.backend.id).in_flight = rng.randrange(10)
        loads = sorted(relative(board, s) for s in candidates)
        chosen = picker.pick(REQUEST, candidates, None, float(t))
        if loads[-1] > loads[-2]:
            assert relative(board, chosen) < loads[-1], t


def test_two_candidates_always_give_the_less_loaded_one() -> None:
    candidates = states((1, 1))
    board = MemoryLoadBoard()
    picker = PowerOfTwo(random.Random(2), CandidateLoads(board))
    board.begin(candidates[1].backend.id, 0)
    assert all(picker.pick(REQUEST, candidates, None, 0.0) is candidates[0] for _ in range(50))


def test_equal_loads_split_evenly_and_one_candidate_is_returned() -> None:
    # The two draws are distinct, and a tie keeps the first: with equal loads the pick is
    # uniform (chi-square with 2 degrees of freedom under its upper 0.1% point, 13.82).
    candidates = states((1, 1, 1))
    picker = PowerOfTwo(random.Random(6), CandidateLoads(MemoryLoadBoard()))
    counts = Counter(picker.pick(REQUEST, candidates, None, 0.0) for _ in range(30_000))
    expected = 10_000
    assert sum((counts[s] - expected) ** 2 / expected for s in candidates) < 13.82
    assert picker.pick(REQUEST, candidates[:1], None, 0.0) is candidates[0]
