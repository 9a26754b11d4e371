"""A simulation's report over time: each client region's service window by window, how long
each crash left its region's clients unserved, and the GPU-hours spent; `timeline_json` is
them as timeline.json (simulate/page.py draws them).

Windows count requests as `fleetgate bench`'s timeline does (bench/timeline.py): in the window
a request was sent in for its latencies and availability (what a request sent then met), in
the window it ended in for throughput and goodput (work counted when it was done).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from fleetgate.bench.stats import Distribution, RequestRecord, Slo
from fleetgate.bench.timeline import MAX_WINDOWS, NICE_WIDTHS_S
from fleetgate.simulate.run import Outcome
from fleetgate.simulate.scenario import EventSpec, Scenario

MIN_WINDOW_S = 10.0  # shorter windows of an hour's run hold too few requests for a p99
# Served again after a crash: a request that succeeds, it and the ones sent after it this
# many in a row at least this available.
RECOVERED_RUN = 10
RECOVERED_AVAILABILITY = 0.99
TIMELINE_FILE = "timeline.json"


@dataclass(frozen=True, slots=True)
class Window:
    """One window of one series; latencies in ms, None where the window has no sample."""

    start_s: float
    sent: int  # requests sent in it
    completed: int  # successful requests that ended in it
    throughput: float  # completed / the window's width, req/s
    goodput: float | None  # of those, the ones meeting the SLO, req/s; None: no SLO given
    availability: float | None  # the share of the requests sent in it that succeeded
    ttft_p50_ms: float | None  # this and the other latencies: successful requests sent in it
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    tpot_p90_ms: float | None
    e2e_p90_ms: float | None
    replicas_up: int  # the fewest up at any moment of it: an outage shorter than it shows
    gpus_up: int
    gpu_s: float  # GPU-seconds up from the run's start to the window's end (or the run's)


@dataclass(frozen=True, slots=True)
class FleetTimeline:
    """A run in windows of `window_s`; window i covers [i * window_s, (i + 1) * window_s)."""

    window_s: float
    all_clients: list[Window]  # every client, and the whole fleet's capacity
    regions: dict[str, list[Window]]  # each region's clients and capacity, the scenario's order


@dataclass(frozen=True, slots=True)
class Failover:
    """How long a crash left its region's clients unserved (see `failover_times`)."""

    event: EventSpec
    served_again_s: float | None  # None: not served again by the end of the run
    request: int | None  # the index of the request that was served


@dataclass(slots=True)
class Capacity:
    """What was up over a run, in steps: from at_s[i] on, replicas[i] replicas, gpus[i] GPUs
    (nothing before the first)."""

    at_s: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)

    def add(self, at_s: float, replicas: int, gpus: int) -> None:
        """A step; one at the same time as the last replaces it (events at one moment)."""
        if self.at_s and self.at_s[-1] == at_s:
            self.replicas[-1], self.gpus[-1] = replicas, gpus
            return
        self.at_s.append(at_s)
        self.replicas.append(replicas)
        self.gpus.append(gpus)

    def fewest(self, start_s: float, end_s: float) -> tuple[int, int]:
        """The fewest replicas and the fewest GPUs up at any moment of [start_s, end_s)."""
        first = bisect.bisect_right(self.at_s, start_s) - 1
        if first < 0:
            return 0, 0  # nothing up before the first step
        steps = range(first, bisect.bisect_left(self.at_s, end_s))
        return min(self.replicas[i] for i in steps), min(self.gpus[i] for i in steps)

    def gpu_seconds(self, until_s: float) -> float:
        """GPU-seconds up from 0 to `until_s`: the sum of GPUs up times how long."""
        ends = [*self.at_s[1:], math.inf]
        return math.fsum(
            g * (min(end, until_s) - start)
            for start, end, g in zip(self.at_s, ends, self.gpus, strict=True)
            if start < until_s
        )


def capacity(scenario: Scenario, outcome: Outcome) -> tuple[Capacity, dict[str, Capacity]]:
    """The whole fleet's capacity in steps, and each region's, from `outcome.capacity`."""
    regions = {r.name: Capacity() for r in scenario.regions}
    fleet = Capacity()
    now: dict[str, tuple[int, int]] = {}
    for at_s, region, replicas, gpus in outcome.capacity:
        now[region] = (replicas, gpus)
        regions[region].add(at_s, replicas, gpus)
        fleet.add(at_s, sum(r for r, _ in now.values()), sum(g for _, g in now.values()))
    return fleet, regions


def default_window_s(span_s: float) -> float:
    """The smallest of bench's nice widths at least max(MIN_WINDOW_S, span / MAX_WINDOWS)
    (60 s for an hour), whole multiples of the last beyond them."""
    goal = max(MIN_WINDOW_S, span_s / MAX_WINDOWS)
    for width in NICE_WIDTHS_S:
        if width >= goal:
            return width
    return NICE_WIDTHS_S[-1] * math.ceil(goal / NICE_WIDTHS_S[-1])


def timeline(scenario: Scenario, outcome: Outcome, window_s: float | None = None) -> FleetTimeline:
    """The run from 0 to its last answer (`outcome.end_s`) in windows of `window_s` (None:
    `default_window_s` of that span)."""
    width = default_window_s(outcome.end_s) if window_s is None else window_s
    if not (width > 0 and math.isfinite(width)):
        raise ValueError(f"a window is a number of seconds > 0, not {width}")
    count = max(1, math.ceil(outcome.end_s / width))
    fleet, by_region = capacity(scenario, outcome)
    slo = scenario.slo.slo()

    def windows(records: Sequence[RequestRecord], up: Capacity) -> list[Window]:
        return _windows(records, up, slo=slo, width=width, count=count, end_s=outcome.end_s)

    regions = {}
    for i, region in enumerate(scenario.regions):
        mine = [r for r, c in zip(outcome.records, outcome.clients, strict=True) if c == i]
        regions[region.name] = windows(mine, by_region[region.name])
    return FleetTimeline(width, windows(outcome.records, fleet), regions)


def _windows(
    records: Sequence[RequestRecord], up: Capacity, *, slo: Slo, width: float, count: int,
    end_s: float,
) -> list[Window]:  # fmt: skip
    def index(t: float) -> int:
        return min(count - 1, max(0, math.floor(t / width)))

    sent: list[list[RequestRecord]] = [[] for _ in range(count)]
    ended: list[list[RequestRecord]] = [[] for _ in range(count)]
    for r in records:
        sent[index(r.sent_s)].append(r)
        if r.ok:
            ended[index(_end_s(r))].append(r)
    result = []
    for i in range(count):
        start = i * width
        ok = [r for r in sent[i] if r.ok]
        ttft = Distribution.of_seconds(r.ttft_s for r in ok if r.ttft_s is not None)
        tpot = Distribution.of_seconds(t for t in (r.tpot_s for r in ok) if t is not None)
        e2e = Distribution.of_seconds(r.e2e_s for r in ok if r.e2e_s is not None)
        good = sum(1 for r in ended[i] if slo.met_by(r))
        replicas, gpus = up.fewest(start, start + width)
        result.append(
            Window(
                start_s=start,
                sent=len(sent[i]),
                completed=len(ended[i]),
                throughput=len(ended[i]) / width,
                goodput=good / width if slo.given else None,
                availability=len(ok) / len(sent[i]) if sent[i] else None,
                ttft_p50_ms=None if ttft is None else ttft.p50,
                ttft_p90_ms=None if ttft is None else ttft.p90,
                ttft_p99_ms=None if ttft is None else ttft.p99,
                tpot_p90_ms=None if tpot is None else tpot.p90,
                e2e_p90_ms=None if e2e is None else e2e.p90,
                replicas_up=replicas,
                gpus_up=gpus,
                gpu_s=up.gpu_seconds(min(start + width, end_s)),
            )
        )
    return result


def _end_s(record: RequestRecord) -> float:
    return record.sent_s + (record.e2e_s or 0.0)


def failover_times(scenario: Scenario, outcome: Outcome) -> list[Failover]:
    """For each crash that happened, how long until the clients in its region were served
    again.

    Take the requests of that region's clients sent at or after the crash, in the order they
    were sent. The first one that succeeded and, with the ones sent after it, makes a run of
    RECOVERED_RUN (fewer at the end of the run) of which at least RECOVERED_AVAILABILITY
    succeeded (10 and 99%: all ten) marks it: the time is from the crash to that request's
    end. A success followed by failures does not count; requests in flight at the crash do
    not either (a retry or continuation may still save them). None when no request qualifies.
    """
    names = [r.name for r in scenario.regions]
    failovers = []
    for event in happened(outcome):
        if event.kind != "crash":
            continue
        region = names.index(event.region)
        after = sorted(
            (r for r, c in zip(outcome.records, outcome.clients, strict=True)
             if c == region and r.sent_s >= event.at_s),
            key=lambda r: (r.sent_s, r.index),
        )  # fmt: skip
        failovers.append(_served_again(event, after))
    return failovers


def _served_again(event: EventSpec, after: Sequence[RequestRecord]) -> Failover:
    for i, record in enumerate(after):
        run = after[i : i + RECOVERED_RUN]
        if record.ok and sum(r.ok for r in run) >= RECOVERED_AVAILABILITY * len(run):
            return Failover(event, _end_s(record) - event.at_s, record.index)
    return Failover(event, None, None)


def happened(outcome: Outcome) -> list[EventSpec]:
    """The scenario's events that took place, in time order: those by the last answer (the run
    stops there, and an event due later never fires)."""
    return sorted((e for e in outcome.events if e.at_s <= outcome.end_s), key=lambda e: e.at_s)


def gpu_hours(scenario: Scenario, outcome: Outcome) -> float:
    """GPU-hours paid for over the run, from its start to its last answer (`outcome.end_s`):
    the replicas up, and those starting (asked for, loading their weights: billed too)."""
    fleet, _ = capacity(scenario, outcome)
    end = outcome.end_s
    starting = math.fsum(g * (min(until, end) - at) for at, until, _, g in outcome.booting
                         if at < end)  # fmt: skip
    return (fleet.gpu_seconds(end) + starting) / 3600.0


def timeline_json(scenario: Scenario, outcome: Outcome, line: FleetTimeline) -> dict[str, Any]:
    """The document written to timeline.json (None where a window has no sample)."""

    def windows(series: list[Window]) -> list[dict[str, Any]]:
        return [dataclasses.asdict(w) for w in series]

    return {
        "scenario": scenario.name,
        "window_s": line.window_s,
        "duration_s": outcome.duration_s,
        "end_s": outcome.end_s,
        "slo": msgspec.to_builtins(scenario.slo),
        "gpu_hours": gpu_hours(scenario, outcome),
        "failovers": [_failover_json(f) for f in failover_times(scenario, outcome)],
        "events": [msgspec.to_builtins(e) for e in happened(outcome)],
        "capacity": [
            {"at_s": at, "region": region, "replicas_up": replicas, "gpus_up": gpus}
            for at, region, replicas, gpus in outcome.capacity
        ],
        "all": windows(line.all_clients),
        "regions": {name: windows(series) for name, series in line.regions.items()},
    }


def _failover_json(failover: Failover) -> dict[str, Any]:
    event = failover.event
    return {
        "at_s": event.at_s,
        "region": event.region,
        "zone": event.zone,
        "replicas": event.replicas,  # crashed; None: all there
        "served_again_s": failover.served_again_s,
        "request": failover.request,
    }
