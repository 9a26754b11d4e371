"""The live view's regions (observe/live.py): each request counted where its backend is, over
the window, fed events at chosen times."""

from __future__ import annotations

import random

from fleetgate.lifecycle.events import NO_BACKEND, Finished, Outcome
from fleetgate.observe.live import HISTORY_S, LiveView
from fleetgate.observe.live_regions import LATENCY_S, OTHER, REGIONS, RegionTraffic

WALL_OFFSET = 1_700_000_000.0
PLACES = {("m", "eu-1"): "eu", ("m", "eu-2"): "eu", ("m", "us-1"): "us", ("m", "bare"): ""}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def view(clock: Clock, places: dict[tuple[str, str], str] = PLACES) -> LiveView:
    def region_of(model: str, backend: str) -> str:
        return places.get((model, backend), "")

    return LiveView(clock, lambda: clock.now + WALL_OFFSET, random.Random(0), region_of)


def finished(
    at: float,
    backend: str,
    status: int = 200,
    outcome: Outcome = "answered",
    e2e: float = 1.0,
    ttft: float | None = 0.1,
) -> Finished:
    return Finished(b"r", at, "m", at - e2e, status, backend, outcome, ttft, 8)


def by_name(live: LiveView) -> dict[str, RegionTraffic]:
    return {r.region: r for r in live.regions().regions}


def test_each_request_counts_in_its_backends_region_and_one_never_routed_in_none() -> None:
    clock = Clock()
    live = view(clock)
    live.on_finished(finished(100.1, "eu-1"))
    live.on_finished(finished(100.2, "eu-2"))
    live.on_finished(finished(101.5, "eu-1", status=502, outcome="failed", ttft=None))
    live.on_finished(finished(101.6, "us-1", status=429))  # the backend's own 429: no error
    live.on_finished(finished(101.7, "bare"))
    live.on_finished(finished(101.8, "gone"))  # left the pool since: no region known
    live.on_finished(finished(101.9, NO_BACKEND, status=503, outcome="rejected", ttft=None))
    live.on_finished(finished(101.9, NO_BACKEND, status=503, outcome="failed", ttft=None))
    clock.now = 102.0
    window = live.regions()
    assert (window.window_s, window.latency_window_s) == (2, 2)
    assert [r.region for r in window.regions] == ["", "eu", "us"]
    eu, us, bare = (by_name(live)[name] for name in ("eu", "us", ""))
    assert (eu.requests, eu.errors) == (3, 1)
    assert (us.requests, us.errors, us.ttft_p50) == (1, 0, None)  # only 2xx answers are timed
    assert (bare.requests, bare.errors) == (2, 0)
    assert sum(p.requests for p in live.points()) == 8  # the never routed count in the total


def test_a_backends_region_is_asked_once_a_second() -> None:
    clock = Clock()
    places = dict(PLACES)
    asked: list[str] = []

    def region_of(model: str, backend: str) -> str:
        asked.append(backend)
        return places.get((model, backend), "")

    live = LiveView(clock, lambda: clock.now, random.Random(0), region_of)
    for _ in range(3):
        live.on_finished(finished(100.5, "eu-1"))
    places["m", "eu-1"] = "us"  # relabelled: from the next second on
    live.on_finished(finished(100.6, "eu-1"))
    live.on_finished(finished(101.5, "eu-1"))
    clock.now = 102.0
    assert asked == ["eu-1", "eu-1"]
    assert [(r.region, r.requests) for r in live.regions().regions] == [("eu", 4), ("us", 1)]


def test_a_region_without_a_lookup_is_not_kept() -> None:
    clock = Clock()
    live = LiveView(clock, lambda: clock.now, random.Random(0))
    live.on_finished(finished(100.5, "eu-1"))
    clock.now = 101.0
    assert live.regions().regions == []
    assert live.points()[0].requests == 1


def test_percentiles_of_ttft_and_e2e_per_region() -> None:
    clock = Clock()
    live = view(clock)
    for i in range(20):  # eu: TTFT 10..200 ms, E2E 1 s more; us: all 2 s
        ttft = (i + 1) / 100
        live.on_finished(finished(100.5, "eu-1" if i % 2 else "eu-2", e2e=ttft + 1.0, ttft=ttft))
        live.on_finished(finished(100.5, "us-1", e2e=2.0, ttft=2.0))
    clock.now = 101.0
    regions = by_name(live)
    eu, us = regions["eu"], regions["us"]
    assert (eu.ttft_p50, eu.ttft_p99) == (0.11, 0.2)
    assert eu.e2e_p50 is not None and abs(eu.e2e_p50 - 1.11) < 1e-9
    assert (us.ttft_p50, us.ttft_p99, us.e2e_p99) == (2.0, 2.0, 2.0)


def test_a_busy_second_weighs_as_many_requests_as_it_served() -> None:
    clock = Clock()
    live = view(clock)
    for _ in range(1000):  # one busy second at TTFT 1 s
        live.on_finished(finished(100.5, "eu-1", ttft=1.0))
    for second in range(1, 11):  # then ten quiet ones at 10 ms, 10 requests each
        for _ in range(10):
            live.on_finished(finished(100.5 + second, "eu-1", ttft=0.01))
    clock.now = 111.0
    eu = by_name(live)["eu"]
    assert eu.requests == 1100
    assert (eu.ttft_p50, eu.ttft_p99) == (1.0, 1.0)  # 1000 of 1100 took 1 s
    busy = live._seconds[0].regions["eu"].ttft.values
    assert len(busy) == 32  # bounded


def test_counts_stay_for_the_window_and_percentiles_for_the_last_minute() -> None:
    clock = Clock()
    live = view(clock)
    live.on_finished(finished(100.5, "eu-1", ttft=0.5))
    live.on_finished(finished(100.5 + LATENCY_S + 5, "eu-1", ttft=0.2))
    clock.now = 100.0 + LATENCY_S + 10
    eu = by_name(live)["eu"]
    assert (eu.requests, eu.ttft_p50) == (2, 0.2)
    assert live._seconds[0].regions["eu"].ttft.values == []  # its samples freed
    clock.now = 100.0 + HISTORY_S + 1
    assert by_name(live)["eu"].requests == 1  # the first second left the window
    assert live.regions().window_s == HISTORY_S
    clock.now = 100.0 + HISTORY_S + LATENCY_S + 10
    assert live.regions().regions == []


def test_regions_past_the_bound_count_under_other_until_one_is_forgotten() -> None:
    clock = Clock()
    places = {("m", f"b{i}"): f"r{i:02}" for i in range(REGIONS + 2)}
    live = view(clock, places)
    for i in range(REGIONS + 2):
        live.on_finished(finished(100.5, f"b{i}"))
    live.on_finished(finished(100.6, f"b{REGIONS}"))
    clock.now = 101.0
    regions = by_name(live)
    assert len(regions) == REGIONS + 1
    assert regions[OTHER].requests == 3
    assert f"r{REGIONS:02}" not in regions
    # Past the window the first ones had requests in, a new region takes their place.
    for second in range(1, HISTORY_S + 2):
        live.on_finished(finished(100.5 + second, "b1"))
    live.on_finished(finished(100.5 + HISTORY_S + 2, f"b{REGIONS}"))
    clock.now = 100.0 + HISTORY_S + 3
    regions = by_name(live)
    assert regions[f"r{REGIONS:02}"].requests == 1
    assert set(regions) == {"r01", f"r{REGIONS:02}"}


def test_a_view_not_counting_regions_keeps_none_and_may_start_later() -> None:
    clock = Clock()
    live = LiveView(clock, lambda: clock.now + WALL_OFFSET, random.Random(0))
    live.on_finished(finished(100.2, "eu-1"))
    clock.now = 101.5
    assert live.regions().regions == []
    live.count_regions(lambda model, backend: PLACES.get((model, backend), ""))
    live.on_finished(finished(101.6, "eu-1"))
    clock.now = 102.5
    assert [(r.region, r.requests) for r in live.regions().regions] == [("eu", 1)]
    live.count_regions(None)
    assert live.regions().regions == []
