"""Counters and histograms for code that runs on one event loop: no locks, plain numbers,
turned into Prometheus metric families only when scraped.

prometheus_client takes a lock per counter add and per histogram bucket; on the gateway's
single-threaded hot path that is pure cost (profiled at ~2% of a core relaying streams).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily


class CounterSeries:
    """A counter per label tuple."""

    __slots__ = ("_doc", "_labels", "_name", "values")

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        self._name, self._doc, self._labels = name, doc, list(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        values = self.values
        values[key] = values.get(key, 0.0) + amount

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self._name, self._doc, labels=self._labels)
        for key, value in self.values.items():
            family.add_metric(list(key), value)
        return family


class Buckets:
    """One label tuple's histogram: counts per bucket and their sum."""

    __slots__ = ("counts", "sum")

    def __init__(self, n: int) -> None:
        self.counts = [0] * n  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0


class HistogramSeries:
    """A histogram per label tuple, with fixed upper bounds (seconds)."""

    __slots__ = ("_bounds", "_doc", "_labels", "_name", "_series")

    def __init__(self, name: str, doc: str, labels: Sequence[str], bounds: Sequence[float]):
        self._name, self._doc, self._labels = name, doc, list(labels)
        self._bounds = tuple(bounds)
        self._series: dict[tuple[str, ...], Buckets] = {}

    @property
    def bounds(self) -> tuple[float, ...]:
        return self._bounds

    def buckets(self, key: tuple[str, ...]) -> Buckets:
        """The histogram of one label tuple, for a caller that observes into it directly
        (counts[bisect_left(bounds, value)] += 1; sum += value): one call fewer per value."""
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = Buckets(len(self._bounds) + 1)
        return series

    def observe(self, key: tuple[str, ...], value: float) -> None:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = Buckets(len(self._bounds) + 1)
        series.counts[bisect_left(self._bounds, value)] += 1  # le: value <= bound
        series.sum += value

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labels)
        edges = [*(repr(b) for b in self._bounds), "+Inf"]
        for key, series in self._series.items():
            running, cumulative = 0, []
            for edge, count in zip(edges, series.counts, strict=True):
                running += count
                cumulative.append((edge, running))
            family.add_metric(list(key), cumulative, series.sum)
        return family
