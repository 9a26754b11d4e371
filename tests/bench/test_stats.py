"""Percentiles, the run summary and goodput against an SLO."""

from __future__ import annotations

from array import array

import pytest

from fleetgate.bench.stats import Distribution, RequestRecord, Slo, percentile, summarize


def ok(index: int, ttft: float, itl: list[float], tokens: int, prompt: int = 10) -> RequestRecord:
    return RequestRecord(
        index=index,
        scheduled_s=float(index),
        sent_s=float(index),
        prompt_tokens=prompt,
        output_tokens=tokens,
        ttft_s=ttft,
        itl_s=array("d", itl),
        e2e_s=ttft + sum(itl),
    )


def failed(index: int, kind: str) -> RequestRecord:
    return RequestRecord(index, float(index), float(index), 10, 0, error=kind, e2e_s=0.5)


def test_percentile_interpolates_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    # numpy.percentile(values, q) for these q: 5.5, 9.1, 9.91, 1.0, 10.0
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 90) == pytest.approx(9.1)
    assert percentile(values, 99) == pytest.approx(9.91)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 10.0
    assert percentile([4.0], 99) == 4.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_distribution_is_in_milliseconds_and_none_when_empty() -> None:
    dist = Distribution.of_seconds([0.003, 0.001, 0.002])
    assert dist is not None
    assert (dist.count, dist.p50, dist.max) == (3, 2.0, 3.0)
    assert (dist.mean, dist.p90, dist.p99) == pytest.approx((2.0, 2.8, 2.98))
    assert Distribution.of_seconds([]) is None


def test_tpot_is_the_mean_gap_per_output_token_after_the_first() -> None:
    assert ok(0, 0.1, [0.02, 0.04], 3).tpot_s == pytest.approx(0.03)
    # Two tokens in one read: 3 tokens over one 0.06 s gap is 0.03 s per token.
    assert ok(0, 0.1, [0.06], 3).tpot_s == pytest.approx(0.03)
    assert ok(0, 0.1, [], 1).tpot_s is None


def test_summary_counts_rates_and_errors() -> None:
    records = [
        ok(0, 0.1, [0.01, 0.01], 3, prompt=100),
        ok(1, 0.3, [0.05], 2, prompt=200),
        failed(2, "http_503"),
        failed(3, "timeout"),
        failed(4, "http_503"),
    ]
    summary = summarize(records, 10.0, Slo())
    assert (summary.requests, summary.completed, summary.failed) == (5, 2, 3)
    assert summary.errors == {"http_503": 2, "timeout": 1}
    assert list(summary.errors) == ["http_503", "timeout"]
    assert summary.request_throughput == pytest.approx(0.2)
    assert summary.input_throughput == pytest.approx(30.0)
    assert summary.output_throughput == pytest.approx(0.5)
    assert summary.ttft_ms is not None
    assert summary.ttft_ms.count == 2
    assert summary.ttft_ms.p50 == pytest.approx(200.0)
    assert summary.itl_ms is not None
    assert summary.itl_ms.count == 3  # pooled over requests
    assert summary.e2e_ms is not None
    assert summary.e2e_ms.max == pytest.approx(350.0)
    assert summary.goodput is None
    assert summary.slo_attainment is None


def test_goodput_counts_successes_within_both_bounds() -> None:
    records = [
        ok(0, 0.100, [0.010, 0.010], 3),  # ttft 100 ms, tpot 10 ms: good
        ok(1, 0.300, [0.010], 2),  # ttft too slow
        ok(2, 0.100, [0.100], 2),  # tpot too slow
        ok(3, 0.050, [], 1),  # one token: no tpot to miss
        failed(4, "read"),  # failures never count
    ]
    summary = summarize(records, 2.0, Slo(ttft_ms=200.0, itl_ms=50.0))
    assert summary.goodput == pytest.approx(1.0)  # 2 good requests / 2 s
    assert summary.slo_attainment == pytest.approx(0.4)
    only_ttft = summarize(records, 2.0, Slo(ttft_ms=200.0))
    assert only_ttft.goodput == pytest.approx(1.5)


def test_empty_run_summarizes_without_dividing_by_zero() -> None:
    summary = summarize([], 0.0, Slo(ttft_ms=1.0))
    assert summary.request_throughput == 0.0
    assert summary.ttft_ms is None
    assert summary.goodput == 0.0
    assert summary.slo_attainment is None
