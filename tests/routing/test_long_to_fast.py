"""`long_to_fast`: prompts of at least `threshold_tokens` keep only the backends whose effective
weight is within `share` of the fastest's, until those build a prefill backlog `slack_tokens`
beyond the least busy backend's; shorter prompts keep every candidate."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import CandidateLoads
from fleetgate.routing.long_to_fast import LongToFast, LongToFastParams
from fleetgate.routing.registry import PluginContext, default_registry


def weighted(*weights: float) -> tuple[BackendState, ...]:
    states = []
    for i, weight in enumerate(weights):
        state = BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",)))
        state.weight = weight  # as calibration sets it
        states.append(state)
    return tuple(states)


def of_tokens(tokens: int) -> RoutingRequest:
    return RoutingRequest("m", "chat", True, prompt=b"x" * (4 * tokens))


MIXED = weighted(2.7, 2.5, 1.0, 1.0)  # two H100s beside two A100s
IDLE = CandidateLoads(MemoryLoadBoard())  # nothing in flight anywhere


def test_long_prompts_keep_only_the_fast_backends() -> None:
    split = LongToFast(IDLE, LongToFastParams(threshold_tokens=2048, share=0.75))
    assert list(split.filter(of_tokens(2048), MIXED, 0.0)) == list(MIXED[:2])
    assert list(split.filter(of_tokens(9000), MIXED, 0.0)) == list(MIXED[:2])


def test_short_prompts_keep_every_candidate() -> None:
    split = LongToFast(IDLE, LongToFastParams(threshold_tokens=2048))
    assert split.filter(of_tokens(2047), MIXED, 0.0) is MIXED


def test_on_an_even_fleet_nothing_is_filtered() -> None:
    even = weighted(1.0, 1.0, 1.0)
    split = LongToFast(IDLE, LongToFastParams(threshold_tokens=10))
    assert list(split.filter(of_tokens(500), even, 0.0)) == list(even)


def test_the_share_sets_how_close_to_the_fastest_a_backend_must_be() -> None:
    loose = LongToFast(IDLE, LongToFastParams(threshold_tokens=10, share=0.35))
    assert list(loose.filter(of_tokens(500), MIXED, 0.0)) == list(MIXED)
    strict = LongToFast(IDLE, LongToFastParams(threshold_tokens=10, share=1.0))
    assert list(strict.filter(of_tokens(500), MIXED, 0.0)) == [MIXED[0]]


def test_long_prompts_overflow_once_the_fast_backends_are_backlogged() -> None:
    fleet = weighted(2.5, 1.0, 1.0, 1.0)  # one H100 beside three A100s
    board = MemoryLoadBoard()
    params = LongToFastParams(threshold_tokens=2048, share=0.75, slack_tokens=8192)
    split = LongToFast(CandidateLoads(board), params)
    pending = [board.load(state.backend.id) for state in fleet]
    pending[0].pending_prefill = 8192 // 2  # 4,096 tokens: 1,638 in the fastest's time...
    pending[1].pending_prefill = 0  # ...beyond an idle A100: within the slack
    assert list(split.filter(of_tokens(4000), fleet, 0.0)) == [fleet[0]]
    pending[0].pending_prefill = 8192 + 8192 // 2 + 1  # (12,289 - 0) tokens > 8,192 of slack
    pending[1].pending_prefill = 0
    assert split.filter(of_tokens(4000), fleet, 0.0) is fleet
    pending[1].pending_prefill = 2000  # an A100's backlog counts in the fastest's time: 5,000
    pending[2].pending_prefill = pending[3].pending_prefill = 2000
    assert list(split.filter(of_tokens(4000), fleet, 0.0)) == [fleet[0]]


def test_the_guard_compares_backlogs_in_the_fastest_backends_time() -> None:
    fleet = weighted(1.0, 0.4)  # calibrated weights: relative speeds
    board = MemoryLoadBoard()
    board.load(fleet[0].backend.id).pending_prefill = 9000
    board.load(fleet[1].backend.id).pending_prefill = 400  # 1,000 in the fastest's time
    within_slack = LongToFast(CandidateLoads(board), LongToFastParams(slack_tokens=8000))
    assert list(within_slack.filter(of_tokens(3000), fleet, 0.0)) == [fleet[0]]
    past_slack = LongToFast(CandidateLoads(board), LongToFastParams(slack_tokens=7999))
    assert past_slack.filter(of_tokens(3000), fleet, 0.0) is fleet


@pytest.mark.parametrize(
    ("threshold", "share", "slack", "field"),
    [
        (0, 0.5, 0, "threshold_tokens"),
        (10, 0.0, 0, "share"),
        (10, 1.5, 0, "share"),
        (10, 0.5, -1, "slack_tokens"),
    ],
)
def test_bad_parameters_are_refused(threshold: int, share: float, slack: int, field: str) -> None:
    with pytest.raises(ValueError, match=f"`{field}` must be"):
        LongToFastParams(threshold_tokens=threshold, share=share, slack_tokens=slack)


def test_the_balanced_profile_keeps_long_prompts_on_the_fast_backends() -> None:
    fleet = weighted(1.0, 1.0, 0.4, 0.4, 0.4, 0.4)  # calibrated: two H100s, four A100s
    board = MemoryLoadBoard()
    ctx = PluginContext(random.Random(7), board)
    pipeline = default_registry().build_pipeline("balanced", {}, ctx)

    def send(tokens: int, i: int) -> BackendState:
        request = RoutingRequest("m", "chat", True, prompt=f"{i:08d}".encode() * (tokens // 2))
        chosen = pipeline.pick(request, fleet, 0.0)
        assert chosen is not None
        board.begin(chosen.backend.id, 0)  # as the pool's begin() counts it; now decoding
        return chosen

    picks = Counter(send(3000 if i % 4 == 0 else 300, i) for i in range(80))
    long_ones = {send(3000, 1000 + i) for i in range(5)}
    assert long_ones <= set(fleet[:2])
    assert all(picks[s] > 0 for s in fleet)  # the A100s serve short ones: the load evens out


def test_in_a_pool_larger_than_the_shortlist_long_prompts_still_reach_the_fast_backends() -> None:
    # 4 H100s among 60 A100s: a random shortlist of 16 holds none of them 29% of the time, and
    # judged by the shortlist's own fastest an A100 would then count as fast.
    fleet = weighted(*([1.0] * 4 + [0.4] * 60))
    ctx = PluginContext(random.Random(3), MemoryLoadBoard())
    pipeline = default_registry().build_pipeline("balanced", {}, ctx)

    def distinct(tokens: int, i: int) -> RoutingRequest:  # no two share a cached prefix
        return RoutingRequest("m", "chat", True, prompt=f"{i:08d}".encode() * (tokens // 2))

    chosen = [pipeline.pick(distinct(3000, i), fleet, i * 0.01) for i in range(200)]
    assert set(chosen) <= set(fleet[:4])
    short = {pipeline.pick(distinct(300, i), fleet, 2.0 + i * 0.01) for i in range(200, 400)}
    assert len(short - set(fleet[:4])) > 20  # short prompts go anywhere


def test_long_prompts_nominate_the_pools_fast_backends_found_again_as_weights_change() -> None:
    fleet = weighted(1.0, 1.0, 0.4, 0.4, 0.4)
    split = LongToFast(IDLE, LongToFastParams(threshold_tokens=10))
    split.roster(fleet)
    assert split.nominate(of_tokens(500), 0.0) == ["b0", "b1"]  # by id
    assert split.nominate(of_tokens(5), 0.0) == []
    sample = fleet[2:]  # a shortlist of A100s only: judged among themselves, none is dropped
    assert split.filter(of_tokens(500), sample, 0.0) is sample
    fleet[0].weight = fleet[1].weight = 0.4  # both H100s throttle: every backend is as fast
    fleet[2].weight = 0.5
    assert split.nominate(of_tokens(500), 0.5) == ["b0", "b1"]  # not found again yet
    again = split.nominate(of_tokens(500), 1.0)  # REFRESH_S later: all five, four drawn
    assert len(again) == 4 and len(set(again)) == 4
    fleet[3].weight = fleet[4].weight = 0.1
    assert split.nominate(of_tokens(500), 0.2) == ["b0", "b1", "b2"]  # the clock went back


def test_a_filter_before_it_sets_what_counts_as_fast() -> None:
    fleet = weighted(1.0, 0.4, 0.4, 0.1, 0.1)
    split = LongToFast(IDLE, LongToFastParams(threshold_tokens=10))
    split.roster(fleet)
    allowed = fleet[1:]  # an earlier filter (a label, a region) dropped the fastest
    assert list(split.filter(of_tokens(500), allowed, 0.0)) == list(fleet[1:3])
