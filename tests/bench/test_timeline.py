"""A run cut into windows: latencies by send time, throughput and errors by end time."""

from __future__ import annotations

import math

import pytest

from fleetgate.bench.stats import RequestRecord
from fleetgate.bench.timeline import timeline, window_width

RECORDS = [
    RequestRecord(0, 0.2, 0.2, 8, 10, ttft_s=0.1, e2e_s=0.5),  # ends at 0.7
    RequestRecord(1, 0.4, 0.4, 8, 20, ttft_s=0.3, e2e_s=1.0),  # ends at 1.4
    RequestRecord(2, 1.1, 1.1, 8, 0, error="http_503", e2e_s=0.2),  # ends at 1.3
    RequestRecord(3, 1.5, 1.5, 8, 5, ttft_s=0.2, e2e_s=1.0),  # ends at 2.5
]


def test_windows_hold_what_was_sent_ended_and_measured_in_them() -> None:
    line = timeline(RECORDS, width_s=1.0)
    assert line.starts_s == [0.0, 1.0, 2.0]
    assert line.sent_per_s == [2.0, 2.0, 0.0]
    assert line.completed_per_s == [1.0, 1.0, 1.0]  # by end: 0.7, 1.4, 2.5
    assert line.output_tokens_per_s == [10.0, 20.0, 5.0]
    assert line.errors_per_s == {"http_503": [0.0, 1.0, 0.0]}
    assert line.in_flight == [2, 1, 0]  # at 0.5, 1.5 and 2.5
    # Latencies by send: requests 0 and 1 in the first window, 3 in the second.
    assert line.ttft_p50_ms[:2] == pytest.approx([200.0, 200.0])
    assert line.ttft_p99_ms[0] == pytest.approx(100.0 + 200.0 * 0.99)
    assert line.e2e_p50_ms[:2] == pytest.approx([750.0, 1000.0])
    assert math.isnan(line.ttft_p50_ms[2])  # nothing sent then: a gap, not a zero
    assert math.isnan(line.e2e_p99_ms[2])


def test_rates_are_per_second_whatever_the_width() -> None:
    line = timeline(RECORDS, width_s=0.5)
    assert len(line.starts_s) == 6
    assert sum(line.sent_per_s) * 0.5 == len(RECORDS)
    assert sum(line.completed_per_s) * 0.5 == 3


def test_the_width_is_a_round_number_for_enough_requests_in_few_enough_windows() -> None:
    assert window_width(60.0, 100_000) == 1.0  # dense: 60 windows
    assert window_width(3600.0, 20_000) == 60.0
    assert window_width(100_000.0, 10**6) == 1800.0  # past the list: multiples of 600 s
    assert window_width(10.0, 65) == 1.0  # sparse: 10 windows of 6.5 requests
    assert window_width(60.0, 300) == 2.0  # 10 requests a window
    assert window_width(0.0, 0) == 0.1
    assert timeline([], None).width_s == 0.1
    assert timeline(RECORDS).width_s == 0.5  # 2.5 s: 10 windows at most
