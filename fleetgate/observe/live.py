"""The last five minutes, second by second, for the live dashboard and `fleetgate top`: how many
requests finished and how (answered, failed, shed, refused), retries, hedges, continuations
and ejections, output tokens, and TTFT, inter-token latency and E2E percentiles; the last
ejections; and per region (the `region` label of the backend that answered a request, or was
tried last), its requests, errors and TTFT and E2E percentiles. Kept from the lifecycle's
events, only while the dashboard is on (each tenant's use is observe/usage.py's).

A second's latencies are a uniform sample of at most `_SAMPLES` of its requests (reservoir
sampling, the injected random source); a point's percentiles are over its second and the four
before it, so a quiet second still has figures. A point is made once, when its second is over;
an event is counted in the second it happened in, or the latest one begun.
The figures per region are observe/live_regions.py's.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

import msgspec

from fleetgate.lifecycle.events import NO_BACKEND, Continued, Ejected, Finished, Hedged, Retried
from fleetgate.lifecycle.hooks import Hooks
from fleetgate.observe.live_regions import RegionOf, RegionSecond, RegionTally, RegionWindow
from fleetgate.observe.reservoir import Reservoir

HISTORY_S = 300
_SMOOTH_S = 5  # seconds a point's percentiles are taken over
_SAMPLES = 256  # latencies kept per second and kind
_EVENTS = 50  # recent ejections kept


class Point(msgspec.Struct):
    """One second: what finished in it, and latency percentiles (seconds; None: no sample)."""

    t: int  # the second's start, the wall clock's Unix time
    requests: int = 0
    ok: int = 0  # answered with a 2xx
    errors: int = 0  # the client got a 5xx
    shed: int = 0  # refused with 503 by admission
    rejected: int = 0  # refused before routing, any status
    retried: int = 0
    hedged: int = 0
    continued: int = 0
    ejected: int = 0
    tokens: int = 0  # output tokens of streams
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    itl_p50: float | None = None
    itl_p99: float | None = None
    e2e_p50: float | None = None
    e2e_p99: float | None = None


class Notice(msgspec.Struct):
    """A notable event for the dashboard's list (an ejection)."""

    time: float  # wall clock
    kind: str
    model: str
    backend: str
    reason: str
    for_s: float


class _Second:
    __slots__ = ("e2e", "index", "itl", "point", "regions", "ttft")

    def __init__(self, index: int, wall: int) -> None:
        self.index = index  # the clock's whole second
        self.point = Point(wall)
        self.ttft = Reservoir()
        self.itl = Reservoir()
        self.e2e = Reservoir()
        self.regions: dict[str, RegionSecond] = {}  # by region, those with requests in it


class LiveView:
    """The rolling seconds. `clock` is the events' clock; `wall_clock` labels the points;
    `region_of` names a request's region by its backend (None: no region is kept)."""

    def __init__(
        self,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        rng: random.Random,
        region_of: RegionOf | None = None,
    ) -> None:
        self._clock = clock
        self._rng = rng
        self._regions: RegionTally | None = None
        self.count_regions(region_of)
        # The clock's seconds are labelled in wall-clock time with one offset, taken now: a
        # second keeps its label however the wall clock is stepped later.
        self._offset = wall_clock() - clock()
        self._started = int(clock())
        self._seconds: deque[_Second] = deque(maxlen=HISTORY_S + _SMOOTH_S)
        self._last = self._second(clock())  # the second begun last, and when it ends
        self._ends = self._last.index + 1.0
        self._points: dict[int, Point] = {}  # made, by second index
        self.notices: deque[Notice] = deque(maxlen=_EVENTS)

    def count_regions(self, region_of: RegionOf | None) -> None:
        """Count requests by region from now on (`region_of` names a backend's), or not (None:
        a fleet with no region labels pays nothing a request for it). What was counted stays
        while the view keeps counting."""
        if region_of is None:
            self._regions = None
        elif self._regions is None:
            self._regions = RegionTally(region_of, HISTORY_S)

    def wall(self, at: float) -> float:
        """The wall-clock time of the clock's `at`."""
        return at + self._offset

    def subscribe(self, hooks: Hooks) -> None:
        hooks.subscribe(Finished, self.on_finished)
        hooks.subscribe(Retried, self.on_retried)
        hooks.subscribe(Hedged, self.on_hedged)
        hooks.subscribe(Continued, self.on_continued)
        hooks.subscribe(Ejected, self.on_ejected)

    def _second(self, at: float) -> _Second:
        """The second `at` falls in (events come in the clock's order: it is the last one, or
        a new one after it)."""
        index = int(at)
        seconds = self._seconds
        if seconds and seconds[-1].index >= index:
            return seconds[-1]  # an event of a second already passed counts in the last
        second = _Second(index, int(self.wall(index)))
        seconds.append(second)
        return second

    def on_finished(self, event: Finished) -> None:
        at = event.at
        second = self._last
        if at >= self._ends:  # a new second (the common case is the same one: no call)
            second = self._second(at)
            self._last, self._ends = second, second.index + 1.0
            if self._regions is not None:
                self._regions.new_second()
        point = second.point
        point.requests += 1
        region: RegionSecond | None = None  # where its backend is (None: never routed)
        if self._regions is not None and event.backend != NO_BACKEND:
            region = self._regions.count(second, event.model, event.backend)
        status = event.status
        if event.outcome != "answered" or not 200 <= status < 300:
            if event.outcome == "rejected":
                point.rejected += 1
                if status == 503:
                    point.shed += 1
            if status >= 500:
                point.errors += 1
                if region is not None:
                    region.errors += 1
            elif 200 <= status < 300:
                point.ok += 1
            return
        point.ok += 1
        e2e = at - event.started
        sample = second.e2e
        sample.seen += 1
        if sample.seen == sample.due:
            sample.offer(e2e, self._rng)
        if region is not None:
            sample = region.e2e
            sample.seen += 1
            if sample.seen == sample.due:
                sample.offer(e2e, self._rng)
        ttft = event.ttft_s
        if ttft is not None:
            sample = second.ttft
            sample.seen += 1
            if sample.seen == sample.due:
                sample.offer(ttft, self._rng)
            if region is not None:
                sample = region.ttft
                sample.seen += 1
                if sample.seen == sample.due:
                    sample.offer(ttft, self._rng)
            tokens = event.output_tokens
            if tokens:
                point.tokens += tokens
                if tokens > 1:
                    sample = second.itl
                    sample.seen += 1
                    if sample.seen == sample.due:
                        sample.offer((e2e - ttft) / (tokens - 1), self._rng)

    def on_retried(self, event: Retried) -> None:
        self._second(event.at).point.retried += 1

    def on_hedged(self, event: Hedged) -> None:
        self._second(event.at).point.hedged += 1

    def on_continued(self, event: Continued) -> None:
        self._second(event.at).point.continued += 1

    def on_ejected(self, event: Ejected) -> None:
        self._second(event.at).point.ejected += 1
        backend = event.backend
        for_s = event.until - event.at
        self.notices.append(
            Notice(self.wall(event.at), "ejected", event.model, backend, event.reason, for_s)
        )

    def points(self, after: int = 0) -> list[Point]:
        """A point for each second over (its events all in) since the view began, at most the
        last `HISTORY_S`, oldest first, of those labelled after `after` (a wall-clock second).
        A second without events has a point of zeros."""
        current = int(self._clock())
        kept = {s.index: s for s in self._seconds}
        made = []
        for index in range(max(self._started, current - HISTORY_S), current):
            label = int(self.wall(index))
            if label <= after:
                continue
            point = self._points.get(index)
            if point is None:
                window = [kept[i] for i in range(index - _SMOOTH_S + 1, index + 1) if i in kept]
                last = kept.get(index)
                point = self._made(last.point if last else Point(label), window)
                self._points[index] = point
            made.append(point)
        for index in [i for i in self._points if i < current - HISTORY_S]:
            del self._points[index]
        return made

    def regions(self) -> RegionWindow:
        """Each region with requests in the seconds over in the window, by name."""
        current = int(self._clock())
        start = max(self._started, current - HISTORY_S)
        if self._regions is None:
            return RegionWindow(current - start, 0, [])
        return self._regions.window(self._seconds, start, current)

    @staticmethod
    def _made(point: Point, window: list[_Second]) -> Point:
        """`point` with its percentiles over the seconds of `window`."""
        ttft = sorted(x for s in window for x in s.ttft.values)
        itl = sorted(x for s in window for x in s.itl.values)
        e2e = sorted(x for s in window for x in s.e2e.values)
        return msgspec.structs.replace(
            point,
            ttft_p50=_quantile(ttft, 0.5), ttft_p99=_quantile(ttft, 0.99),
            itl_p50=_quantile(itl, 0.5), itl_p99=_quantile(itl, 0.99),
            e2e_p50=_quantile(e2e, 0.5), e2e_p99=_quantile(e2e, 0.99),
        )  # fmt: skip


def _quantile(ordered: list[float], q: float) -> float | None:
    """The nearest-rank quantile of sorted values (None: no values)."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
