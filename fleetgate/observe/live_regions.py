"""The live view's figures per region (observe/live.py): requests, errors (5xx the client got),
and TTFT and E2E percentiles, by the `region` label of the backend that answered a request or
was tried last for it.

A region's counts are over the view's whole window, its percentiles over the last `LATENCY_S`,
from per-second tallies kept beside the live view's points: a count of requests and errors
and a small sample of latencies (`SAMPLES` a second), each sample weighing the requests it
stands for, so a busy second counts for what it served. A request's region is its backend's,
asked of `region_of` (the composition root's) once a second per backend and remembered until
the next (a backend's id is unique in the gateway, so it names one place); one never routed
(refused, or answered by the gateway itself) has none and is not counted. At most `REGIONS`
regions are kept apart in the window; the rest count under `OTHER`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

import msgspec

from fleetgate.observe.reservoir import Reservoir

REGIONS = 32  # regions kept apart in the window; requests of any more count under OTHER
OTHER = "(other)"
LATENCY_S = 60  # a region's percentiles are over its last this many seconds
SAMPLES = 32  # latencies kept per second, region and kind
# (model, backend id) -> the backend's `region` label ("": none, or no longer in the pool).
RegionOf = Callable[[str, str], str]


class RegionTraffic(msgspec.Struct):
    """One region over the window: requests its backends answered or were tried last for, the
    5xx among them, and latency percentiles (seconds; None: no sample)."""

    region: str  # the backends' label; "": none; OTHER: past the `REGIONS` kept apart
    requests: int = 0
    errors: int = 0  # the client got a 5xx
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    e2e_p50: float | None = None
    e2e_p99: float | None = None


class RegionWindow(msgspec.Struct):
    """Every region seen in the window: its counts over `window_s` (the seconds over since the
    view began, at most the view's history), its percentiles over the last `latency_window_s`."""

    window_s: int
    latency_window_s: int
    regions: list[RegionTraffic]


class RegionSecond:
    """One region's tally in one second."""

    __slots__ = ("e2e", "errors", "requests", "ttft")

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.ttft = Reservoir(SAMPLES)
        self.e2e = Reservoir(SAMPLES)


class Second(Protocol):
    """What the tally reads of a live view's second."""

    @property
    def index(self) -> int: ...

    @property
    def regions(self) -> dict[str, RegionSecond]: ...


class RegionTally:
    """The regions of a live view (module docstring)."""

    def __init__(self, region_of: RegionOf, history_s: int) -> None:
        self._region_of = region_of
        self._history_s = history_s
        self._labels: dict[str, str] = {}  # backends' regions, by id, asked this second
        self._named: dict[str, int] = {}  # regions kept apart: the last second they had requests
        self._full_until = 0  # while `_named` is full, none of them can be forgotten before
        # The seconds' tallies holding latency samples, oldest first, with their seconds.
        self._sampled: deque[tuple[int, dict[str, RegionSecond]]] = deque()

    def new_second(self) -> None:
        self._labels.clear()

    def count(self, second: Second, model: str, backend: str) -> RegionSecond:
        """A request of `backend` in `second`: counted, and its region's tally there."""
        label = self._labels.get(backend)
        if label is None:
            label = self._labels[backend] = self._region_of(model, backend)
        region = second.regions.get(label)
        if region is None:  # its first request in this second
            region = self._region(second, label)
        region.requests += 1
        return region

    def _region(self, second: Second, label: str) -> RegionSecond:
        """The tally of region `label` in `second`, made for its first request there (so at
        most once a second per region): under OTHER when `REGIONS` others are kept apart and
        none of them can be forgotten yet (it has had no request in the window)."""
        named, index = self._named, second.index
        if label not in named and len(named) >= REGIONS:
            label = self._room_for(label, index)
        if label != OTHER:
            named[label] = index
        regions = second.regions
        region = regions.get(label)
        if region is None:
            if not regions:
                self._sampled.append((index, regions))
                self._drop_old_samples(index)
            region = regions[label] = RegionSecond()
        return region

    def _room_for(self, label: str, index: int) -> str:
        """`label`, once the regions kept apart that had no request in the window are
        forgotten; OTHER when none of them can be yet (nor before `_full_until`)."""
        named = self._named
        if index >= self._full_until:
            gone = [name for name, last in named.items() if last < index - self._history_s]
            for name in gone:
                del named[name]
            if gone:
                return label
            self._full_until = min(named.values()) + self._history_s + 1  # the soonest
        return OTHER

    def _drop_old_samples(self, index: int) -> None:
        """Free the latency samples of the seconds before the last `LATENCY_S` (their counts
        stay for the window)."""
        sampled = self._sampled
        while sampled[0][0] < index - LATENCY_S:
            for region in sampled.popleft()[1].values():
                region.ttft.values.clear()
                region.e2e.values.clear()

    def window(self, seconds: Iterable[Second], start: int, current: int) -> RegionWindow:
        """Each region with requests in the seconds from `start` to before `current`."""
        recent = max(start, current - LATENCY_S)
        traffic: dict[str, RegionTraffic] = {}
        ttft: dict[str, list[tuple[float, float]]] = {}
        e2e: dict[str, list[tuple[float, float]]] = {}
        for second in seconds:
            if not start <= second.index < current:
                continue
            for name, region in second.regions.items():
                counted = traffic.get(name)
                if counted is None:
                    counted = traffic[name] = RegionTraffic(name)
                counted.requests += region.requests
                counted.errors += region.errors
                if second.index >= recent:
                    _weighed(ttft.setdefault(name, []), region.ttft)
                    _weighed(e2e.setdefault(name, []), region.e2e)
        for name, counted in traffic.items():
            counted.ttft_p50, counted.ttft_p99 = _weighted_quantiles(ttft.get(name, []))
            counted.e2e_p50, counted.e2e_p99 = _weighted_quantiles(e2e.get(name, []))
        regions = [traffic[name] for name in sorted(traffic)]
        return RegionWindow(current - start, current - recent, regions)


def _weighed(samples: list[tuple[float, float]], reservoir: Reservoir) -> None:
    """Add a second's sample, each value weighing the requests it stands for (seen / kept)."""
    values = reservoir.values
    if values:
        weight = reservoir.seen / len(values)
        samples.extend((value, weight) for value in values)


def _weighted_quantiles(samples: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    """The p50 and p99 of weighed values (None: no values)."""
    if not samples:
        return None, None
    samples.sort()
    total = sum(weight for _, weight in samples)
    return _weighted_quantile(samples, 0.5 * total), _weighted_quantile(samples, 0.99 * total)


def _weighted_quantile(ordered: list[tuple[float, float]], rank: float) -> float:
    """The first value in order whose cumulative weight passes `rank` (q x the whole weight:
    the nearest-rank quantile when every weight is 1)."""
    passed = 0.0
    for value, weight in ordered:
        passed += weight
        if passed > rank:
            return value
    return ordered[-1][0]  # rounding left the sum a hair short
