"""`weighted_round_robin`: exact shares per cycle of sum(w) picks, spread out, not bunched."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.router import Router
from fleetgate.routing.weighted_round_robin import WeightedRoundRobin

MakeRouter = Callable[[str, Sequence[float]], Router]
REQUEST = RoutingRequest("m", "chat", stream=False)


def states(weights: Sequence[float]) -> tuple[BackendState, ...]:
    return tuple(
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",), w))
        for i, w in enumerate(weights)
    )


def picks(candidates: Sequence[BackendState], count: int) -> list[BackendState]:
    picker = WeightedRoundRobin(random.Random(0))
    return [picker.pick(REQUEST, candidates, None, float(t)) for t in range(count)]


def longest_run(sequence: Sequence[BackendState], state: BackendState) -> int:
    return max(
        (len(list(group)) for key, group in itertools.groupby(sequence) if key is state),
        default=0,
    )


@pytest.mark.parametrize(
    "weights", [(1, 1, 1), (3, 2, 1), (5, 1, 1), (7, 3), (2, 5, 3, 1), (10, 1), (4, 4, 1, 1, 2)]
)
def test_every_full_cycle_splits_exactly_by_integer_weight(weights: tuple[int, ...]) -> None:
    candidates = states(weights)
    cycle = sum(weights)
    sequence = picks(candidates, cycle * 200)
    for start in range(0, len(sequence), cycle):
        counts = Counter(sequence[start : start + cycle])
        assert counts == dict(zip(candidates, weights, strict=True)), start // cycle


def test_fractional_weights_keep_every_prefix_within_one_pick_of_its_share() -> None:
    weights = (1.5, 0.5, 0.25)
    candidates = states(weights)
    total = sum(weights)
    counts: Counter[BackendState] = Counter()
    for t, chosen in enumerate(picks(candidates, 2000), start=1):
        counts[chosen] += 1
        for state, w in zip(candidates, weights, strict=True):
            assert abs(counts[state] - t * w / total) <= 1.0, (t, state)


def test_light_backends_never_come_twice_in_a_row() -> None:
    candidates = states((5, 1, 1))
    sequence = picks(candidates, 7 * 100)
    for light in candidates[1:]:
        assert longest_run(sequence, light) == 1


def test_the_heavy_backend_runs_at_most_three_in_a_row() -> None:
    # 5 picks of a among 7 slots with b and c spread out: runs of 2 and 3 (`a a b a a c a`,
    # repeated), as the class docstring promises. Bunching b and c together gives a run of 5.
    candidates = states((5, 1, 1))
    sequence = picks(candidates, 7 * 100)
    assert longest_run(sequence, candidates[0]) <= 3


def test_load_does_not_change_the_schedule(make_router: MakeRouter) -> None:
    idle, busy = (
        make_router("weighted_round_robin", [2, 1]),
        make_router("weighted_round_robin", [2, 1]),
    )
    for _ in range(100):
        busy.pool.begin(busy.pool.states[0].backend.id, 0.0)

    def schedule(router: Router) -> list[str]:
        return [router.pick(REQUEST, float(t)).backend.id for t in range(30)]  # type: ignore[union-attr]

    assert schedule(busy) == schedule(idle)


def test_a_new_candidate_set_restarts_the_cycle_over_the_survivors() -> None:
    everyone = states((3, 2, 1))
    picker = WeightedRoundRobin(random.Random(0))
    for t in range(4):  # stop mid-cycle
        picker.pick(REQUEST, everyone, None, float(t))
    survivors = (everyone[0], everyone[2])
    sequence = [picker.pick(REQUEST, survivors, None, float(t)) for t in range(4 * 20)]
    assert everyone[1] not in sequence
    for start in range(0, len(sequence), 4):
        assert Counter(sequence[start : start + 4]) == {everyone[0]: 3, everyone[2]: 1}
