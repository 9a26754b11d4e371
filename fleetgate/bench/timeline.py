"""A run over time: its records cut into equal windows, for the plots of a report.

A request belongs to two windows: the one it was sent in, for its latencies (the latency a
request sent at t met, so a burst of arrivals lines up with the latency it caused), and the
one it ended in, for throughput and errors (events counted when they happen). Percentiles are
`stats.percentile`'s. A window with no sample has NaN, which a plot draws as a gap.

These are the load generator's own view of the whole target. Load on each backend is not in
the records (a response does not say which backend served it); `backends` reads it from a
fleetgate gateway's /metrics instead.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from fleetgate.bench.stats import RequestRecord, percentile

MAX_WINDOWS = 60  # about as many points as a plot a page wide shows well
MIN_WINDOWS = 10  # fewer hide the shape of the run
PER_WINDOW = 10  # requests a window should hold on average, for its percentiles to mean much
# Widths a reader takes in at a glance; a run's is the smallest at least `window_width`'s goal.
NICE_WIDTHS_S = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(frozen=True, slots=True)
class Timeline:
    """Series over windows of `width_s` seconds; index i covers [i * width_s, (i+1) * width_s)."""

    width_s: float
    starts_s: list[float]
    sent_per_s: list[float]  # offered load
    completed_per_s: list[float]  # successful requests that ended in the window
    output_tokens_per_s: list[float]  # their output tokens
    in_flight: list[int]  # requests sent and not yet ended at the window's middle
    ttft_p50_ms: list[float]  # successful requests sent in the window; NaN when none
    ttft_p99_ms: list[float]
    e2e_p50_ms: list[float]
    e2e_p99_ms: list[float]
    errors_per_s: dict[str, list[float]]  # by kind, most common first, by when they ended


def window_width(span_s: float, requests: int) -> float:
    """The smallest nice width of at least
    max(span / MAX_WINDOWS, min(span / MIN_WINDOWS, span * PER_WINDOW / requests)):
    never more than MAX_WINDOWS windows, and PER_WINDOW requests in each on average unless
    that leaves fewer than MIN_WINDOWS."""
    sparse = span_s * PER_WINDOW / requests if requests else span_s
    goal = max(span_s / MAX_WINDOWS, min(span_s / MIN_WINDOWS, sparse))
    for width in NICE_WIDTHS_S:
        if width >= goal:
            return width
    # Beyond the list: whole multiples of its last width.
    last = NICE_WIDTHS_S[-1]
    return last * math.ceil(goal / last)


def _end_s(record: RequestRecord) -> float:
    return record.sent_s + (record.e2e_s or 0.0)


def timeline(records: Sequence[RequestRecord], width_s: float | None = None) -> Timeline:
    """The run's series; `width_s` None: chosen by `window_width` from the run's span."""
    span = max((_end_s(r) for r in records), default=0.0)
    width = width_s if width_s is not None else window_width(span, len(records))
    n = max(1, math.floor(span / width) + 1)

    def index(t: float) -> int:
        return min(n - 1, max(0, math.floor(t / width)))

    sent = [0] * n
    completed = [0] * n
    tokens = [0] * n
    ttft: list[list[float]] = [[] for _ in range(n)]
    e2e: list[list[float]] = [[] for _ in range(n)]
    errors: dict[str, list[float]] = {}
    for r in records:
        sent[index(r.sent_s)] += 1
        end = index(_end_s(r))
        if r.error is not None:
            errors.setdefault(r.error, [0.0] * n)[end] += 1.0 / width
            continue
        completed[end] += 1
        tokens[end] += r.output_tokens
        if r.ttft_s is not None:
            ttft[index(r.sent_s)].append(r.ttft_s * 1000.0)
        if r.e2e_s is not None:
            e2e[index(r.sent_s)].append(r.e2e_s * 1000.0)
    starts = [i * width for i in range(n)]
    return Timeline(
        width_s=width,
        starts_s=starts,
        sent_per_s=[c / width for c in sent],
        completed_per_s=[c / width for c in completed],
        output_tokens_per_s=[c / width for c in tokens],
        in_flight=_in_flight(records, [s + width / 2 for s in starts]),
        ttft_p50_ms=_percentiles(ttft, 50),
        ttft_p99_ms=_percentiles(ttft, 99),
        e2e_p50_ms=_percentiles(e2e, 50),
        e2e_p99_ms=_percentiles(e2e, 99),
        errors_per_s=dict(sorted(errors.items(), key=lambda item: -sum(item[1]))),
    )


def _percentiles(windows: list[list[float]], q: float) -> list[float]:
    return [percentile(sorted(w), q) if w else math.nan for w in windows]


def _in_flight(records: Sequence[RequestRecord], at_s: list[float]) -> list[int]:
    """How many requests were in flight (sent at or before t, ended after it) at each t."""
    sends = sorted(r.sent_s for r in records)
    ends = sorted(_end_s(r) for r in records)
    return [bisect.bisect_right(sends, t) - bisect.bisect_right(ends, t) for t in at_s]
