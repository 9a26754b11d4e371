"""The report over time (simulate/report.py) on outcomes built by hand: each window's counts,
rates and latencies, availability through a crash, capacity and GPU-seconds, the time until a
crashed region's clients are served again."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from fleetgate.bench.stats import RequestRecord, percentile
from fleetgate.simulate.report import (
    Capacity,
    default_window_s,
    failover_times,
    gpu_hours,
    timeline,
)
from fleetgate.simulate.run import Outcome
from fleetgate.simulate.scenario import EventSpec, Scenario, parse_scenario

CRASH = EventSpec(at_s=20.0, kind="crash", region="east")
RECOVER = EventSpec(at_s=35.0, kind="recover", region="east")


def scenario(**changes: Any) -> Scenario:
    """East: 2 replicas of 2 GPUs; west: 1 of 1."""
    data: dict[str, Any] = {
        "regions": [
            {"name": "east", "pools": [{"model": "m", "replicas": 2, "gpus": 2}]},
            {"name": "west", "pools": [{"model": "m", "replicas": 1}]},
        ],
        "gateway": {"pools": [{"model": "m"}]},
        "slo": {"ttft_ms": 500},
        **changes,
    }
    return parse_scenario(data)


def record(
    index: int, sent_s: float, ttft_s: float = 0.1, e2e_s: float = 1.0, error: str | None = None
) -> RequestRecord:
    """A request of 11 output tokens (TPOT = (e2e - ttft) / 10) or, with `error`, a failure."""
    return RequestRecord(
        index=index, scheduled_s=sent_s, sent_s=sent_s, prompt_tokens=100,
        output_tokens=0 if error else 11, error=error, ttft_s=None if error else ttft_s,
        itl_s=array("d", [] if error else [e2e_s - ttft_s]), e2e_s=e2e_s,
    )  # fmt: skip


def outcome(
    records: list[RequestRecord],
    clients: list[int] | None = None,
    end_s: float = 60.0,
    capacity: list[tuple[float, str, int, int]] | None = None,
    events: tuple[EventSpec, ...] = (),
) -> Outcome:
    return Outcome(
        records=records,
        clients=[0] * len(records) if clients is None else clients,
        tenants=[-1] * len(records),
        duration_s=end_s,
        end_s=end_s,
        wall_s=0.1,
        capacity=capacity or [(0.0, "east", 2, 4), (0.0, "west", 1, 1)],
        events=events,
        booting=[],
        prefix_hit_rate=0.0,
    )


def test_each_window_counts_what_was_sent_in_it_and_what_ended_in_it() -> None:
    ttfts = [0.1, 0.2, 0.3, 0.9]  # the last one misses the 500 ms SLO
    records = [record(i, 1.0 + i, ttft_s=t) for i, t in enumerate(ttfts)]
    records.append(record(4, 8.0, e2e_s=4.0))  # sent in window 0, ends in window 1
    records.append(record(5, 9.0, error="http_502"))
    line = timeline(scenario(), outcome(records, end_s=30.0), window_s=10.0)
    assert line.window_s == 10.0
    first, second, third = line.regions["east"]
    assert [w.start_s for w in line.regions["east"]] == [0.0, 10.0, 20.0]
    assert (first.sent, first.completed, second.sent, second.completed) == (6, 4, 0, 1)
    assert first.throughput == pytest.approx(0.4)
    assert first.goodput == pytest.approx(0.3)
    assert second.throughput == second.goodput == pytest.approx(0.1)
    assert first.availability == pytest.approx(5 / 6)
    assert second.availability is None and second.ttft_p99_ms is None
    ms = sorted(t * 1000 for t in [*ttfts, 0.1])
    assert first.ttft_p50_ms == pytest.approx(percentile(ms, 50))
    assert first.ttft_p90_ms == pytest.approx(percentile(ms, 90))
    assert first.ttft_p99_ms == pytest.approx(percentile(ms, 99))
    tpots = [*((1.0 - t) * 100 for t in ttfts), 390.0]  # ms per token after the first
    assert first.tpot_p90_ms == pytest.approx(percentile(sorted(tpots), 90))
    assert first.e2e_p90_ms == pytest.approx(percentile([1000.0] * 4 + [4000.0], 90))
    assert third.sent == third.completed == 0
    # West sent nothing; all clients are east's here.
    assert [w.sent for w in line.regions["west"]] == [0, 0, 0]
    assert [w.sent for w in line.all_clients] == [6, 0, 0]


def test_without_an_slo_there_is_no_goodput() -> None:
    line = timeline(scenario(slo={}), outcome([record(0, 1.0)], end_s=10.0), window_s=10.0)
    assert line.all_clients[0].goodput is None
    assert line.all_clients[0].throughput == pytest.approx(0.1)


def test_availability_dips_in_the_windows_of_a_crash_and_capacity_shows_it() -> None:
    # A request every second from each region; east's fail from the crash at 20 s to 35 s.
    records, clients = [], []
    for t in range(59):
        east_fails = 20 <= t < 35
        records.append(record(2 * t, float(t), error="http_502" if east_fails else None))
        records.append(record(2 * t + 1, t + 0.5))
        clients += [0, 1]
    capacity = [(0.0, "east", 2, 4), (0.0, "west", 1, 1), (20.0, "east", 0, 0),
                (35.0, "east", 2, 4)]  # fmt: skip
    line = timeline(scenario(), outcome(records, clients, capacity=capacity), window_s=10.0)
    east, west, every = line.regions["east"], line.regions["west"], line.all_clients
    assert [w.availability for w in east] == [1.0, 1.0, 0.0, 0.5, 1.0, 1.0]
    assert [w.availability for w in west] == [1.0] * 6
    assert [w.availability for w in every] == [1.0, 1.0, 0.5, 0.75, 1.0, 1.0]
    assert [w.completed for w in east] == [9, 10, 1, 4, 10, 10]  # by when they ended
    # The fewest up in each window: the window of the recovery still had none at its start.
    assert [w.replicas_up for w in east] == [2, 2, 0, 0, 2, 2]
    assert [w.gpus_up for w in every] == [5, 5, 1, 1, 5, 5]
    assert [w.replicas_up for w in west] == [1] * 6


def test_gpu_seconds_add_up_what_was_up_and_a_short_outage_shows_in_its_window() -> None:
    capacity = [(0.0, "east", 2, 4), (0.0, "west", 1, 1), (25.0, "east", 1, 2),
                (28.0, "east", 2, 4)]  # fmt: skip
    run = outcome([record(0, 1.0)], end_s=55.0, capacity=capacity)
    line = timeline(scenario(), run, window_s=10.0)
    east = line.regions["east"]
    # 4 GPUs to 25 s, 2 to 28 s, 4 again to the end at 55 s (the last window stops there).
    assert [w.gpu_s for w in east] == pytest.approx([40, 80, 114, 154, 194, 214])
    assert [w.gpu_s for w in line.regions["west"]] == pytest.approx([10, 20, 30, 40, 50, 55])
    assert line.all_clients[-1].gpu_s == pytest.approx(269)
    assert gpu_hours(scenario(), run) == pytest.approx(269 / 3600)
    # Down for 3 s in the middle of [20 s, 30 s): the window says so.
    assert [(w.replicas_up, w.gpus_up) for w in east] == [(2, 4)] * 2 + [(1, 2)] + [(2, 4)] * 3


def test_events_at_one_moment_change_the_fleet_once() -> None:
    # At 15 s east goes down as west comes up: the fleet goes from 2 replicas to 1, never
    # through a moment with neither (east's entry first, then west's).
    capacity = [(0.0, "east", 2, 4), (0.0, "west", 0, 0), (15.0, "east", 0, 0),
                (15.0, "west", 1, 1)]  # fmt: skip
    line = timeline(scenario(), outcome([], end_s=30.0, capacity=capacity), window_s=10.0)
    assert [w.replicas_up for w in line.all_clients] == [2, 1, 1]
    assert [w.gpu_s for w in line.all_clients] == pytest.approx([40, 65, 75])
    # Before its first step nothing was up.
    late = Capacity()
    late.add(5.0, 1, 1)
    assert late.fewest(0.0, 10.0) == (0, 0)
    assert late.gpu_seconds(10.0) == pytest.approx(5.0)


def test_the_default_window_is_a_sixtieth_of_the_run_rounded_up_and_at_least_10_s() -> None:
    assert default_window_s(3600.0) == 60.0
    assert default_window_s(100.0) == 10.0
    assert default_window_s(1000.0) == 30.0  # 16.7 s rounded up to a width people read
    assert default_window_s(36_000.0) == 600.0
    assert default_window_s(100_000.0) == 1800.0  # multiples of 600 s past the list
    line = timeline(scenario(), outcome([record(0, 1.0)], end_s=3590.0))
    assert line.window_s == 60.0 and len(line.all_clients) == 60


def failover_run(east: list[bool], events: tuple[EventSpec, ...]) -> Outcome:
    """East's clients send one request a second from 0 s (True: it succeeds) and take 2 s;
    west's one a second that always succeeds."""
    records, clients = [], []
    for t, ok in enumerate(east):
        records.append(record(2 * t, float(t), e2e_s=2.0, error=None if ok else "http_502"))
        records.append(record(2 * t + 1, float(t)))
        clients += [0, 1]
    return outcome(records, clients, end_s=len(east) + 2.0, events=events)


def test_a_crash_is_failed_over_when_ten_requests_in_a_row_succeed() -> None:
    # Crash at 20 s. From 20 s on: 3 failures, a lone success at 23 s (the next one fails),
    # then successes from 25 s on: served again when the request sent at 25 s ends, at 27 s.
    east = [True] * 20 + [False] * 3 + [True, False] + [True] * 20
    (failover,) = failover_times(scenario(), failover_run(east, (CRASH, RECOVER)))
    assert failover.event == CRASH
    assert failover.served_again_s == pytest.approx(7.0)
    assert failover.request == 2 * 25
    # One failure among the ten after the success at 25 s delays it to the next clean run.
    east[30] = False
    (failover,) = failover_times(scenario(), failover_run(east, (CRASH, RECOVER)))
    assert failover.served_again_s == pytest.approx(31 + 2 - 20)


def test_a_region_never_served_again_has_no_failover_time_and_late_events_none() -> None:
    east = [True] * 20 + [False] * 25
    late = EventSpec(at_s=500.0, kind="crash", region="west")  # after the run: never fired
    failovers = failover_times(scenario(), failover_run(east, (CRASH, late)))
    assert [(f.event, f.served_again_s, f.request) for f in failovers] == [(CRASH, None, None)]


def test_a_crash_without_a_pause_in_service_fails_over_at_once() -> None:
    (failover,) = failover_times(scenario(), failover_run([True] * 40, (CRASH,)))
    assert failover.served_again_s == pytest.approx(2.0)  # the first request after it
