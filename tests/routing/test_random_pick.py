"""`random`: uniform over the candidates, ignoring weight and load (the baseline policy)."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Hashable, Sequence

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.random_pick import RandomPick

REQUEST = RoutingRequest("m", "chat", stream=False)
# Upper 0.1% points of the chi-square distribution: a fair picker exceeds them once in 1000 seeds.
CHI2_999 = {4: 18.467, 24: 51.179}


def states(weights: Sequence[float]) -> tuple[BackendState, ...]:
    return tuple(
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",), w))
        for i, w in enumerate(weights)
    )


def chi_square(counts: Counter[Hashable], cells: Sequence[Hashable]) -> float:
    expected = sum(counts.values()) / len(cells)
    return sum((counts[c] - expected) ** 2 / expected for c in cells)


def test_picks_are_uniform_whatever_the_weights_and_load() -> None:
    candidates = states((1, 1, 4, 0.5, 2))  # and it is given no load board to read
    for seed in range(5):
        picker = RandomPick(random.Random(seed))
        counts = Counter(picker.pick(REQUEST, candidates, None, float(t)) for t in range(50_000))
        assert chi_square(counts, candidates) < CHI2_999[4], seed


def test_consecutive_picks_are_independent() -> None:
    # Pairs (previous, next) are uniform over all 25 combinations: no rotation, no repeats.
    candidates = states((1,) * 5)
    picker = RandomPick(random.Random(11))
    sequence = [picker.pick(REQUEST, candidates, None, float(t)) for t in range(50_001)]
    pairs = Counter(itertools.pairwise(sequence))
    cells = [(a, b) for a in candidates for b in candidates]
    assert chi_square(pairs, cells) < CHI2_999[24]


def test_a_seed_replays_the_same_picks() -> None:
    candidates = states((1, 1, 1))
    first = RandomPick(random.Random(3))
    second = RandomPick(random.Random(3))
    assert [first.pick(REQUEST, candidates, None, 0.0) for _ in range(100)] == [
        second.pick(REQUEST, candidates, None, 0.0) for _ in range(100)
    ]
