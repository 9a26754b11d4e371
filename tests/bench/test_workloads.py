"""Request specs, arrival processes and run bounds."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from fleetgate.bench.workloads import (
    Bursts,
    Message,
    PoissonArrivals,
    RequestSpec,
    TraceTimes,
    bounded,
    schedule,
    user_request,
)


def specs_at(times: list[float]) -> list[RequestSpec]:
    return [user_request(t, " the", 1, 4, "chat") for t in times]


def test_prompt_joins_the_messages_contents() -> None:
    spec = RequestSpec(0.0, (Message("system", " a b"), Message("user", " c")), 3, 8)
    assert spec.prompt == " a b c"
    assert user_request(0.0, " x", 1, 0, "completions").max_tokens == 1  # never ask for 0


def test_trace_speed_divides_trace_times() -> None:
    times = [0.0, 1.0, 2.5, 10.0]
    sped = schedule(specs_at(times), TraceTimes(2.0), random.Random(0))
    assert [s.at_s for s in sped] == [0.0, 0.5, 1.25, 5.0]
    slowed = schedule(specs_at(times), TraceTimes(0.5), random.Random(0))
    assert [s.at_s for s in slowed] == [0.0, 2.0, 5.0, 20.0]


def test_poisson_arrivals_have_the_rate_and_exponential_gaps() -> None:
    rate, n = 50.0, 5000
    specs = schedule(specs_at([0.0] * n), PoissonArrivals(rate), random.Random(7))
    times = [s.at_s for s in specs]
    gaps = [b - a for a, b in itertools.pairwise([0.0, *times])]
    # Mean gap 1/rate: the standard error of the mean is 1/rate/sqrt(n) ~ 1.4%; allow 5%.
    assert statistics.fmean(gaps) == pytest.approx(1.0 / rate, rel=0.05)
    # Exponential gaps have a coefficient of variation of 1 (a fixed-rate pacer would have 0).
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)
    # Counts per 1 s window are Poisson(rate): variance close to the mean.
    counts = [0] * math.ceil(times[-1])
    for t in times:
        counts[int(t)] += 1
    assert statistics.variance(counts[:-1]) == pytest.approx(rate, rel=0.35)


def test_poisson_arrivals_ignore_trace_times_and_are_seeded() -> None:
    a = [
        s.at_s for s in schedule(specs_at([5.0, 0.0, 9.0]), PoissonArrivals(2.0), random.Random(1))
    ]
    b = [
        s.at_s for s in schedule(specs_at([0.0, 0.0, 0.0]), PoissonArrivals(2.0), random.Random(1))
    ]
    assert a == b
    assert a == sorted(a)


def test_infinite_rate_sends_everything_at_once() -> None:
    specs = schedule(specs_at([1.0, 2.0]), PoissonArrivals(math.inf), random.Random(0))
    assert [s.at_s for s in specs] == [0.0, 0.0]


def test_bounded_stops_at_duration_and_count_and_is_lazy() -> None:
    endless = (user_request(float(i), " a", 1, 1, "chat") for i in itertools.count())
    assert [s.at_s for s in bounded(endless, 3.0)] == [0.0, 1.0, 2.0]
    endless = (user_request(float(i), " a", 1, 1, "chat") for i in itertools.count())
    assert len(list(bounded(endless, 100.0, max_requests=5))) == 5
    assert list(bounded(specs_at([0.0]), 10.0, max_requests=0)) == []


def test_arrivals_validate_their_numbers() -> None:
    with pytest.raises(ValueError, match="speed"):
        TraceTimes(0.0)
    with pytest.raises(ValueError, match="rate"):
        PoissonArrivals(-1.0)


def test_bursts_keep_the_mean_rate_and_bunch_the_requests() -> None:
    rate, n = 20.0, 20_000
    times = [
        s.at_s for s in schedule(specs_at([0.0] * n), Bursts(rate, 8.0, 1.0), random.Random(3))
    ]
    assert times == sorted(times)
    assert n / times[-1] == pytest.approx(rate, rel=0.05)
    # Per 1 s window the count varies far more than a Poisson count's (variance = mean):
    # bursts of 8 on average, each within one or two windows.
    counts = [0] * math.ceil(times[-1])
    for t in times:
        counts[int(t)] += 1
    assert statistics.variance(counts[:-1]) > 4 * rate
    single = [
        s.at_s for s in schedule(specs_at([0.0] * n), Bursts(rate, 1.0, 0.0), random.Random(3))
    ]
    gaps = [b - a for a, b in itertools.pairwise(single)]
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"rate": 0.0}, "rate"), ({"rate": math.inf}, "rate"),
     ({"rate": 1.0, "size": 0.5}, "burst size"), ({"rate": 1.0, "size": 1e9}, "burst size"),
     ({"rate": 1.0, "size": math.nan}, "burst size"), ({"rate": 1.0, "spread_s": -1.0}, "spread")],
)  # fmt: skip
def test_bad_bursts_are_refused(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Bursts(**fields)
