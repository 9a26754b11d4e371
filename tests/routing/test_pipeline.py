"""The routing pipeline: filters narrow, scorers combine as sum(w_i * s_i) / sum(w_i), one picks."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import LoadBoard, MemoryLoadBoard
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.pipeline import RoutingPipeline
from fleetgate.routing.round_robin import RoundRobin
from fleetgate.routing.weighted_round_robin import WeightedRoundRobin

REQUEST = RoutingRequest("m", "chat", stream=False)

# Plugins written against the protocols in routing/base.py, as a third party would write them.


class LabelFilter:
    """Keeps candidates whose label `key` is `value`."""

    def __init__(self, key: str, value: str) -> None:
        self.key, self.value = key, value

    def filter(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> Sequence[BackendState]:
        kept = [c for c in candidates if c.backend.labels.get(self.key) == self.value]
        return candidates if len(kept) == len(candidates) else kept


class IdleScorer:
    """1 / (1 + in_flight), in_flight from a load board."""

    def __init__(self, board: LoadBoard) -> None:
        self.board = board

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        return [1.0 / (1 + self.board.load(c.backend.id).in_flight) for c in candidates]


class WeightScorer:
    """weight / max weight."""

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        top = max(c.weight for c in candidates)
        return [c.weight / top for c in candidates]


class HighestScore:
    """Picks the best combined score; remembers what it was given."""

    def __init__(self) -> None:
        self.seen: list[tuple[Sequence[BackendState], Sequence[float] | None, float]] = []

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        scores: Sequence[float] | None,
        now: float,
    ) -> BackendState:
        self.seen.append((candidates, scores, now))
        assert scores is not None
        return candidates[max(range(len(candidates)), key=scores.__getitem__)]


def states() -> tuple[BackendState, ...]:
    spec = [("b0", 1.0, "us"), ("b1", 2.0, "eu"), ("b2", 4.0, "us"), ("b3", 1.0, "eu")]
    return tuple(
        BackendState(
            Backend(name, f"http://{name}:8000", ("m",), w, {"region": region, "pool": "m"})
        )
        for name, w, region in spec
    )


@pytest.mark.parametrize(
    "filters",
    [[], [LabelFilter("pool", "m")], [LabelFilter("pool", "m"), LabelFilter("pool", "m")]],
)
def test_the_picker_keeps_its_index_when_no_filter_drops_anyone(filters: list[LabelFilter]) -> None:
    # Index-keeping pickers rebuild when the candidates' identity changes; a pipeline that
    # copied them on every pick would restart weighted_round_robin's cycle each time (and so
    # always pick the heaviest backend).
    candidates = states()
    pipeline = RoutingPipeline(WeightedRoundRobin(random.Random(0)), filters=filters)
    picks = Counter(pipeline.pick(REQUEST, candidates, float(t)) for t in range(8 * 10))
    assert picks == {s: int(s.weight * 10) for s in candidates}


def test_filters_narrow_in_order_and_none_left_gives_none() -> None:
    candidates = states()
    us = RoutingPipeline(RoundRobin(random.Random(0)), filters=[LabelFilter("region", "us")])
    assert {us.pick(REQUEST, candidates, 0.0) for _ in range(10)} == {candidates[0], candidates[2]}
    nowhere = RoutingPipeline(
        RoundRobin(random.Random(0)),
        filters=[LabelFilter("region", "us"), LabelFilter("region", "eu")],
    )
    assert nowhere.pick(REQUEST, candidates, 0.0) is None


def test_scores_combine_as_a_weighted_mean() -> None:
    candidates = states()
    board = MemoryLoadBoard()
    board.load("b2").in_flight = 3
    picker = HighestScore()
    pipeline = RoutingPipeline(picker, scorers=[(IdleScorer(board), 3.0), (WeightScorer(), 1.0)])
    chosen = pipeline.pick(REQUEST, candidates, 2.5)
    idle = [1.0, 1.0, 0.25, 1.0]
    weight = [0.25, 0.5, 1.0, 0.25]
    expected = [(3 * i + w) / 4 for i, w in zip(idle, weight, strict=True)]
    seen_candidates, scores, now = picker.seen[-1]
    assert seen_candidates is candidates
    assert scores == pytest.approx(expected)
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert now == 2.5
    assert chosen is candidates[1]


def test_a_pick_can_explain_each_scorer_s_score_of_the_chosen_backend() -> None:
    candidates = states()
    board = MemoryLoadBoard()
    board.load("b2").in_flight = 3
    scorers = [(IdleScorer(board), 3.0), (WeightScorer(), 1.0)]
    pipeline = RoutingPipeline(HighestScore(), scorers=scorers)
    why: dict[str, float] = {}
    chosen = pipeline.pick(REQUEST, candidates, 0.0, why)
    assert chosen is candidates[1]
    assert why == {"IdleScorer": 1.0, "WeightScorer": 0.5}  # b1's own scores
    lone: dict[str, float] = {}
    assert pipeline.pick(REQUEST, candidates[:1], 0.0, lone) is candidates[0]
    assert lone == {}  # nothing to compare: nothing scored


def test_scorers_see_only_the_filtered_candidates() -> None:
    candidates = states()
    picker = HighestScore()
    pipeline = RoutingPipeline(
        picker, filters=[LabelFilter("region", "eu")], scorers=[(WeightScorer(), 1.0)]
    )
    assert pipeline.pick(REQUEST, candidates, 0.0) is candidates[1]
    seen_candidates, scores, _ = picker.seen[-1]
    assert list(seen_candidates) == [candidates[1], candidates[3]]
    assert scores == [1.0, 0.5]
