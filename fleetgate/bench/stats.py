"""What one request measured, and the run's summary: latency percentiles, throughput, goodput.

Definitions (latencies in the summary are milliseconds):
- TTFT: send to the first network read that carried generated text.
- ITL: the gaps between successive reads that carried text, pooled over all requests. A read
  that brings several chunks at once is one arrival, so bursts do not add zero gaps.
- TPOT: a request's mean time per output token after the first,
  (last text read - first text read) / (output tokens - 1).
- E2E: send to the end of the response.
- Throughputs and goodput divide by the run's duration; only successful requests count.
- Goodput: successful requests per second with TTFT <= --slo-ttft-ms and TPOT <= --slo-itl-ms
  (each bound only when given), the per-request mean as DistServe and vLLM's bench use it.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request's outcome. Times are seconds; `sent_s` is after the run's start."""

    index: int  # position in the workload
    scheduled_s: float  # when the workload wanted it sent
    sent_s: float  # when it was sent
    prompt_tokens: int
    output_tokens: int  # the server's usage count, else the streamed text's tokens
    error: str | None = None  # None when it succeeded, else its kind: "http_503", "timeout", ...
    ttft_s: float | None = None  # None when not streamed or no text arrived
    itl_s: array[float] = field(default_factory=lambda: array("d"))  # compact: runs are long
    e2e_s: float | None = None  # to success or failure
    retry_after_s: float | None = None  # a refusal's Retry-After, when it had one

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first, or None with fewer than two."""
        if self.output_tokens < 2 or self.ttft_s is None:
            return None
        return math.fsum(self.itl_s) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-request latency objective for goodput; a bound left None is not checked."""

    ttft_ms: float | None = None
    itl_ms: float | None = None  # checked against the request's TPOT

    @property
    def given(self) -> bool:
        return self.ttft_ms is not None or self.itl_ms is not None

    def met_by(self, record: RequestRecord) -> bool:
        if not record.ok:
            return False
        if self.ttft_ms is not None and (
            record.ttft_s is None or record.ttft_s * 1000.0 > self.ttft_ms
        ):
            return False
        tpot = record.tpot_s
        return self.itl_ms is None or tpot is None or tpot * 1000.0 <= self.itl_ms


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks (numpy's
    default): rank = q / 100 * (n - 1). `sorted_values` must be sorted and non-empty."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = q / 100.0 * (len(sorted_values) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Distribution:
    """Mean, percentiles and max of one latency, in milliseconds, over `count` samples."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of_seconds(cls, values: Iterable[float]) -> Distribution | None:
        """The distribution of `values` (seconds) in milliseconds, or None when there are none."""
        ms = sorted(v * 1000.0 for v in values)
        if not ms:
            return None
        return cls(
            len(ms),
            math.fsum(ms) / len(ms),
            percentile(ms, 50),
            percentile(ms, 90),
            percentile(ms, 99),
            ms[-1],
        )


@dataclass(frozen=True, slots=True)
class Summary:
    """The run in numbers; see the module docstring for what each one means."""

    duration_s: float
    requests: int  # sent
    completed: int
    failed: int
    errors: Mapping[str, int]  # failures by kind, most common first
    request_throughput: float  # completed requests/s
    input_throughput: float  # prompt tokens of completed requests/s
    output_throughput: float  # output tokens/s
    ttft_ms: Distribution | None
    itl_ms: Distribution | None
    tpot_ms: Distribution | None
    e2e_ms: Distribution | None
    slo: Slo
    goodput: float | None  # requests/s meeting the SLO; None when no SLO was given
    slo_attainment: float | None  # share of sent requests meeting the SLO


def summarize(records: Sequence[RequestRecord], duration_s: float, slo: Slo) -> Summary:
    """Summarize a run of `duration_s` seconds whose requests ended as `records`."""
    ok = [r for r in records if r.ok]
    errors = Counter(r.error for r in records if r.error is not None)
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    good = sum(1 for r in ok if slo.met_by(r)) if slo.given else None
    tpots = (r.tpot_s for r in ok)
    return Summary(
        duration_s=duration_s,
        requests=len(records),
        completed=len(ok),
        failed=len(records) - len(ok),
        errors=dict(errors.most_common()),
        request_throughput=len(ok) * per_s,
        input_throughput=sum(r.prompt_tokens for r in ok) * per_s,
        output_throughput=sum(r.output_tokens for r in ok) * per_s,
        ttft_ms=Distribution.of_seconds(r.ttft_s for r in ok if r.ttft_s is not None),
        itl_ms=Distribution.of_seconds(x for r in ok for x in r.itl_s),
        tpot_ms=Distribution.of_seconds(t for t in tpots if t is not None),
        e2e_ms=Distribution.of_seconds(r.e2e_s for r in ok if r.e2e_s is not None),
        slo=slo,
        goodput=None if good is None else good * per_s,
        slo_attainment=None if good is None or not records else good / len(records),
    )
