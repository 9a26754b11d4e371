"""`slo`: cost_i = s_i (q_i + P) / T + d_i * s_i P / (L - 1) / I, score_i = min_j cost_j /
cost_i: a long prompt's prefill is priced by what it adds to the answers streaming there."""

from __future__ import annotations

import random

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import CandidateLoads
from fleetgate.routing.registry import PluginContext, PluginSpec, Profile, default_registry
from fleetgate.routing.slo_aware import Objectives, SloScorer, SloScorerParams


def states(n: int) -> tuple[BackendState, ...]:
    return tuple(
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8200 + i}", ("m",))) for i in range(n)
    )


def measured(state: BackendState, prefill_s_per_token: float) -> None:
    """One 11-token answer to a 100-token prompt, as the fleet accounting records it."""
    ttft = prefill_s_per_token * 100
    state.latency.record_stream(ttft, ttft + 0.5, tokens=11, prefill_tokens=100)


def request(prompt_tokens: int, max_tokens: int | None = 31) -> RoutingRequest:
    return RoutingRequest("m", "chat", True, max_tokens=max_tokens, prompt=b"x" * 4 * prompt_tokens)


def streaming(board: MemoryLoadBoard, state: BackendState, answers: int, prompt: int) -> None:
    """`answers` requests of `prompt` tokens there, each past its first token."""
    for _ in range(answers):
        board.begin(state.backend.id, prompt)
        board.prefilled(state.backend.id, prompt)


def waiting_beside_streaming() -> tuple[MemoryLoadBoard, BackendState, BackendState]:
    """A board where one backend has four 2,000-token prompts waiting for their prefill and
    none streaming, the other four such answers streaming and none waiting; both measured at
    0.1 ms of prefill a token."""
    board = MemoryLoadBoard()
    queued, streams = states(2)
    for state in (queued, streams):
        measured(state, 0.0001)
    for _ in range(4):
        board.begin(queued.backend.id, 2000)
    streaming(board, streams, answers=4, prompt=2000)
    return board, queued, streams


def test_a_long_prompt_goes_where_fewer_answers_stream_when_its_wait_is_alike() -> None:
    board = MemoryLoadBoard()
    crowded, quiet = states(2)
    for state in (crowded, quiet):
        measured(state, 0.0001)
    streaming(board, crowded, answers=10, prompt=2000)
    streaming(board, quiet, answers=2, prompt=2000)
    scores = SloScorer(CandidateLoads(board)).score(request(2000), (crowded, quiet), now=0.0)
    # ttft 0.2 s of 2 s: 0.1 each; delta = 0.2 / 30 s on each answer, over 0.2 s:
    # crowded 0.1 + 10 / 30 = 0.4333, quiet 0.1 + 2 / 30 = 0.1667
    assert scores == pytest.approx([0.1667 / 0.4333, 1.0], rel=1e-3)


def test_prompts_waiting_for_prefill_count_as_wait_not_as_answers_streaming() -> None:
    board, queued, streams = waiting_beside_streaming()
    scores = SloScorer(CandidateLoads(board)).score(request(2000), (queued, streams), now=0.0)
    # queued: 0.0001 * 10,000 / 2 = 0.5;  streams: 0.1 + 4 * (0.2 / 30) / 0.2 = 0.2333
    assert scores == pytest.approx([0.2333 / 0.5, 1.0], rel=1e-3)


def test_the_objectives_ratio_decides_between_waiting_and_slowing_others() -> None:
    board, queued, streams = waiting_beside_streaming()
    loads = CandidateLoads(board)
    # A tight first-token objective: waiting costs more; a tight time per token: slowing.
    eager = SloScorer(loads, objectives=Objectives(ttft_s=0.5, tpot_s=0.2))
    assert eager.score(request(2000), (queued, streams), 0.0)[1] == 1.0
    smooth = SloScorer(loads, SloScorerParams(ttft_s=2.0, tpot_s=0.01), Objectives(0.5, 0.2))
    assert smooth.score(request(2000), (queued, streams), 0.0)[0] == 1.0  # params win


def test_unmeasured_backends_take_the_least_known_speed_and_nothing_known_scores_all_one() -> None:
    board = MemoryLoadBoard()
    known, new = states(2)
    scorer = SloScorer(CandidateLoads(board))
    assert scorer.score(request(500), (known, new), 0.0) == [1.0, 1.0]
    measured(known, 0.001)
    streaming(board, known, answers=1, prompt=500)
    scores = scorer.score(request(500), (known, new), 0.0)
    assert scores[1] == 1.0 and scores[0] < 1.0  # the new one is tried, not avoided


def test_the_registry_builds_it_with_the_pools_objectives_and_refuses_bad_parameters() -> None:
    board, queued, streams = waiting_beside_streaming()
    registry = default_registry()
    for objectives, best in ((Objectives(0.5, 0.2), 1), (Objectives(2.0, 0.01), 0)):
        ctx = PluginContext(random.Random(0), board, objectives=objectives)
        (scorer,) = registry.build_profile(Profile.of(("slo", 1)), ctx).scorers
        assert scorer.score(request(2000), (queued, streams), 0.0)[best] == 1.0
    ctx = PluginContext(random.Random(0), board)
    for params, key in (({"ttft_s": -1}, "ttft_s"), ({"tpot_s": 0}, "tpot_s"),
                        ({"itl_s": 0.1}, "unknown parameter 'itl_s'")):  # fmt: skip
        with pytest.raises(ValueError, match=key):
            registry.build_profile(Profile(((PluginSpec("slo", params), 1.0),)), ctx)
