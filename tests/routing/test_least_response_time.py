"""`least_response_time`: T_i = prefill_i * (pending_i + P) + tpot_i * N * (1 + q_i),
score_i = min_j T_j / T_i; unmeasured speeds take the best measured value."""

from __future__ import annotations

import random

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.engine_load import EngineLoad
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.least_response_time import DEFAULT_OUTPUT_TOKENS, LeastResponseTime
from fleetgate.routing.load import CandidateLoads
from fleetgate.routing.registry import PluginContext, default_registry


def states(n: int) -> tuple[BackendState, ...]:
    return tuple(
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",))) for i in range(n)
    )


def scorer(board: MemoryLoadBoard | None = None) -> LeastResponseTime:
    """The scorer over `board` (an empty one: nothing in flight anywhere)."""
    return LeastResponseTime(CandidateLoads(board or MemoryLoadBoard()))


def measured(state: BackendState, prefill_s_per_token: float, tpot_s: float) -> None:
    """One answer of 101 tokens to a 100-token prompt, as the fleet accounting records it."""
    ttft = prefill_s_per_token * 100
    state.latency.record_stream(ttft, ttft + tpot_s * 100, tokens=101, prefill_tokens=100)


def request(prompt_tokens: int, max_tokens: int | None) -> RoutingRequest:
    return RoutingRequest("m", "chat", True, max_tokens=max_tokens, prompt=b"x" * 4 * prompt_tokens)


def test_the_faster_backend_scores_one_and_the_slower_its_time_ratio() -> None:
    fast, slow = states(2)
    measured(fast, prefill_s_per_token=0.001, tpot_s=0.02)
    measured(slow, prefill_s_per_token=0.002, tpot_s=0.05)
    scores = scorer().score(request(100, 100), (slow, fast), now=0.0)
    # fast: 0.001 * 100 + 0.02 * 100 = 2.1 s;  slow: 0.2 + 5 = 5.2 s
    assert scores == pytest.approx([2.1 / 5.2, 1.0])


def test_a_long_fresh_engine_queue_loses_and_a_stale_one_is_ignored() -> None:
    busy, idle = states(2)
    for state in (busy, idle):
        measured(state, prefill_s_per_token=0.001, tpot_s=0.02)  # measured with none in flight
    busy.engine = EngineLoad(4, 20, 0.5, 0.0, 0.0, None, scraped_at=10.0)
    idle.engine = EngineLoad(4, 0, 0.5, 0.0, 0.0, None, scraped_at=10.0)
    scores = scorer().score(request(100, 100), (busy, idle), now=12.0)
    # decode slows with the queue: busy 0.1 + 2.0 * (1 + 24) = 50.1 s, idle 0.1 + 2.0 * 5
    assert scores == pytest.approx([10.1 / 50.1, 1.0])
    assert scorer().score(request(100, 100), (busy, idle), now=15.5) == [1.0, 1.0]


def test_the_gateways_own_count_moves_the_prediction_between_scrapes() -> None:
    a, b = states(2)
    for state in (a, b):
        measured(state, prefill_s_per_token=0.001, tpot_s=0.02)
    board = MemoryLoadBoard()
    board.load(a.backend.id).in_flight = 3  # sent since any scrape: four times as busy
    assert scorer(board).score(request(100, 100), (a, b), now=0.0) == pytest.approx(
        [2.1 / 8.1, 1.0]
    )


def test_the_queue_a_request_joins_lengthens_its_decode() -> None:
    busy, idle = states(2)
    busy.latency.record_stream(0.1, 2.1, tokens=101, prefill_tokens=100)
    idle.latency.record_stream(0.1, 2.1, tokens=101, prefill_tokens=100)
    board = MemoryLoadBoard()
    board.load(busy.backend.id).in_flight = 8  # eight requests ahead of this one
    # busy: 0.1 + 0.02 * 100 * 9 = 18.1 s;  idle: 0.1 + 0.02 * 100 * 1 = 2.1 s
    scores = scorer(board).score(request(100, 100), (busy, idle), now=0.0)
    assert scores == pytest.approx([2.1 / 18.1, 1.0])


def test_an_unmeasured_backend_gets_the_best_measured_values() -> None:
    fast, slow, new = states(3)
    measured(fast, prefill_s_per_token=0.001, tpot_s=0.02)
    measured(slow, prefill_s_per_token=0.004, tpot_s=0.08)
    scores = scorer().score(request(100, 100), (fast, slow, new), now=0.0)
    assert scores == pytest.approx([1.0, 0.25, 1.0])  # tried, not avoided


def test_prompts_still_waiting_for_their_prefill_are_a_queue_this_request_joins() -> None:
    known, queued = states(2)
    for state in (known, queued):
        measured(state, prefill_s_per_token=0.001, tpot_s=0.02)
    board = MemoryLoadBoard()
    board.load(queued.backend.id).pending_prefill = 2000
    scores = scorer(board).score(request(100, 100), (known, queued), now=0.0)
    # queued: 0.001 * (2000 + 100) + 2.0 = 4.1 s against 2.1 s
    assert scores == pytest.approx([1.0, 2.1 / 4.1])


def test_with_nothing_measured_every_backend_scores_one() -> None:
    assert scorer().score(request(100, 100), states(3), now=0.0) == [1.0, 1.0, 1.0]


def test_long_answers_favour_decode_speed_and_long_prompts_prefill_speed() -> None:
    prefiller, decoder = states(2)
    measured(prefiller, prefill_s_per_token=0.0005, tpot_s=0.05)
    measured(decoder, prefill_s_per_token=0.005, tpot_s=0.01)
    lrt = scorer()
    # 8000-token prompt, 10-token answer: 4 + 0.5 = 4.5 s against 40 + 0.1 = 40.1 s
    long_prompt = lrt.score(request(8000, 10), (prefiller, decoder), now=0.0)
    assert long_prompt == pytest.approx([1.0, 4.5 / 40.1])
    # 10-token prompt, 2000-token answer: 0.005 + 100 s against 0.05 + 20 s
    long_answer = lrt.score(request(10, 2000), (prefiller, decoder), now=0.0)
    assert long_answer == pytest.approx([20.05 / 100.005, 1.0])


def test_without_max_tokens_the_backends_mean_answer_length_is_assumed() -> None:
    a, b = states(2)
    measured(a, prefill_s_per_token=0.0, tpot_s=0.01)  # answers of 101 tokens
    b.latency.tpot_s = 0.02
    b.latency.output_tokens = 10.0
    scores = scorer().score(request(100, None), (a, b), now=0.0)
    assert scores == pytest.approx([0.2 / 1.01, 1.0])  # a: 1.01 s, b: 0.2 s
    fresh, other = states(2)
    fresh.latency.tpot_s = 0.01  # no answer length measured yet: DEFAULT_OUTPUT_TOKENS
    other.latency.tpot_s = 0.02
    other.latency.output_tokens = 100.0
    scores = scorer().score(request(100, None), (fresh, other), now=0.0)
    assert scores == pytest.approx([2.0 / (0.01 * DEFAULT_OUTPUT_TOKENS), 1.0])


def test_the_profile_sends_each_request_to_the_backend_that_finishes_it_first() -> None:
    prefiller, decoder, slow = states(3)
    measured(prefiller, prefill_s_per_token=0.0005, tpot_s=0.05)
    measured(decoder, prefill_s_per_token=0.005, tpot_s=0.01)
    measured(slow, prefill_s_per_token=0.01, tpot_s=0.1)
    ctx = PluginContext(random.Random(7), MemoryLoadBoard())
    pipeline = default_registry().build_pipeline("least_response_time", {}, ctx)
    candidates = (prefiller, decoder, slow)
    assert {pipeline.pick(request(8000, 10), candidates, 0.0) for _ in range(10)} == {prefiller}
    assert {pipeline.pick(request(10, 2000), candidates, 0.0) for _ in range(10)} == {decoder}
