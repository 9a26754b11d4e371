"""Per-backend latency averages."""

from __future__ import annotations

import pytest

from fleetgate.fleet.latency import ALPHA, LatencyStats


def test_the_first_sample_sets_the_average_and_later_ones_move_it_by_alpha() -> None:
    stats = LatencyStats()
    stats.record_stream(ttft_s=0.1, e2e_s=1.1, tokens=11)
    assert (stats.ttft_s, stats.e2e_s) == (0.1, 1.1)
    assert stats.tpot_s == pytest.approx(0.1)
    stats.record_stream(ttft_s=0.3, e2e_s=1.3, tokens=11)
    assert stats.ttft_s == pytest.approx(0.1 + ALPHA * 0.2)
    stats.record_response(e2e_s=2.0)
    assert stats.e2e_s == pytest.approx(1.1 + ALPHA * 0.2 + ALPHA * (2.0 - (1.1 + ALPHA * 0.2)))


def test_a_one_token_answer_says_nothing_about_time_per_token() -> None:
    stats = LatencyStats()
    stats.record_stream(ttft_s=0.1, e2e_s=0.1, tokens=1)
    assert stats.tpot_s is None


def test_prefill_speed_and_answer_length_are_averaged_per_token_and_per_answer() -> None:
    stats = LatencyStats()
    stats.record_stream(ttft_s=0.2, e2e_s=1.0, tokens=40, prefill_tokens=1000)
    assert stats.prefill_s_per_token == pytest.approx(0.0002)
    assert stats.output_tokens == 40
    stats.record_stream(ttft_s=0.2, e2e_s=1.0, tokens=90)  # prompt size unknown
    assert stats.prefill_s_per_token == pytest.approx(0.0002)
    assert stats.output_tokens == pytest.approx(40 + ALPHA * 50)
