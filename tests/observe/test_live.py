"""The live view's seconds (observe/live.py), fed events at chosen times."""

from __future__ import annotations

import random

from fleetgate.lifecycle.events import Continued, Ejected, Finished, Outcome, Retried
from fleetgate.observe.live import HISTORY_S, LiveView

WALL_OFFSET = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def view(clock: Clock) -> LiveView:
    return LiveView(clock, lambda: clock.now + WALL_OFFSET, random.Random(0))


def finished(
    at: float,
    status: int = 200,
    outcome: Outcome = "answered",
    e2e: float = 1.0,
    ttft: float | None = 0.1,
    tokens: int | None = 10,
) -> Finished:
    return Finished(b"r", at, "m", at - e2e, status, "b1", outcome, ttft, tokens)


def test_each_second_counts_what_finished_in_it_by_how() -> None:
    clock = Clock()
    live = view(clock)
    live.on_finished(finished(100.2))
    live.on_finished(finished(100.5, status=502, outcome="failed", ttft=None, tokens=None))
    live.on_finished(finished(100.6, status=503, outcome="rejected", ttft=None, tokens=None))
    live.on_finished(finished(100.7, status=429, outcome="rejected", ttft=None, tokens=None))
    live.on_retried(Retried(b"r", 100.8, "m", 502))
    live.on_continued(Continued(b"r", 102.1, "m", "b1", 4))
    clock.now = 103.0
    first, empty, third = live.points()
    assert first.t == int(100 + WALL_OFFSET)
    assert (first.requests, first.ok, first.errors, first.shed, first.rejected) == (4, 1, 2, 1, 2)
    assert (first.retried, first.tokens) == (1, 10)
    assert (empty.requests, empty.ttft_p50) == (0, 0.1)  # percentiles over the last 5 seconds
    assert third.continued == 1
    assert live.points(after=third.t) == []  # nothing new since
    assert [p.t for p in live.points(after=first.t)] == [empty.t, third.t]


def test_percentiles_of_ttft_inter_token_latency_and_e2e() -> None:
    clock = Clock()
    live = view(clock)
    for i in range(100):  # TTFT 10..1000 ms; 11 tokens, 1 s after the first: ITL 100 ms
        ttft = (i + 1) / 100
        live.on_finished(finished(100.5, e2e=ttft + 1.0, ttft=ttft, tokens=11))
    clock.now = 101.0
    (point,) = live.points()
    assert (point.ttft_p50, point.ttft_p99) == (0.51, 1.0)
    assert point.itl_p50 is not None and abs(point.itl_p50 - 0.1) < 1e-9
    assert point.e2e_p99 is not None and abs(point.e2e_p99 - 2.0) < 1e-9
    assert point.tokens == 1100


def test_a_busy_second_keeps_a_bounded_uniform_sample() -> None:
    clock = Clock()
    live = view(clock)
    for i in range(10_000):
        live.on_finished(finished(100.5, ttft=i / 10_000))
    clock.now = 101.0
    (point,) = live.points()
    assert point.requests == 10_000
    assert point.ttft_p50 is not None and 0.4 < point.ttft_p50 < 0.6  # not the first 256 only
    kept = live._seconds[-1].ttft.values  # the second's sample: bounded
    assert len(kept) == 256


def test_history_is_bounded_and_points_start_when_the_view_began() -> None:
    clock = Clock()
    live = view(clock)
    clock.now = 105.0
    assert len(live.points()) == 5  # zeros since the start, none before it
    for second in range(1000):
        clock.now = 105.0 + second
        live.on_finished(finished(clock.now))
        live.points()
    assert len(live.points()) == HISTORY_S


def test_the_last_ejections() -> None:
    clock = Clock()
    live = view(clock)
    live.on_ejected(Ejected(b"r", 100.5, "m", "b1", 110.5, "consecutive_failures"))
    (notice,) = live.notices
    assert (notice.backend, notice.reason, notice.for_s) == ("b1", "consecutive_failures", 10.0)
    assert notice.time == 100.5 + WALL_OFFSET
    clock.now = 101.0
    assert live.points()[0].ejected == 1
