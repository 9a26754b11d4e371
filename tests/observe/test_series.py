"""The lock-free series render exactly what prometheus_client's own metrics render."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.registry import Collector

from fleetgate.observe.series import CounterSeries, HistogramSeries

BOUNDS = (0.01, 0.1, 1.0, 10.0)


class _Both(Collector):
    def __init__(self, *series: CounterSeries | HistogramSeries) -> None:
        self._series = series

    def collect(self):  # type: ignore[no-untyped-def]
        for s in self._series:
            yield s.family()


def test_counter_and_histogram_match_prometheus_client() -> None:
    rng = random.Random(3)
    ours_c = CounterSeries("reqs", "requests", ["model", "status"])
    ours_h = HistogramSeries("lat_seconds", "latency", ["model"], BOUNDS)
    theirs = CollectorRegistry()
    ref_c = Counter("reqs", "requests", ["model", "status"], registry=theirs)
    ref_h = Histogram("lat_seconds", "latency", ["model"], buckets=BOUNDS, registry=theirs)
    values = [*BOUNDS, 0.0, 99.0] + [rng.expovariate(1.0) for _ in range(500)]  # edges too
    for value in values:
        model = rng.choice(["a", "b"])
        status = rng.choice(["200", "502"])
        ours_c.inc((model, status))
        ref_c.labels(model, status).inc()
        ours_h.observe((model,), value)
        ref_h.labels(model).observe(value)
    ours = CollectorRegistry()
    ours.register(_Both(ours_c, ours_h))

    def samples(
        registry: CollectorRegistry,
    ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (s.name, tuple(sorted(s.labels.items()))): round(s.value, 9)
            for family in registry.collect()
            for s in family.samples
            if not s.name.endswith("_created")
        }

    assert samples(ours) == samples(theirs)
    assert b"reqs_total" in generate_latest(ours)
