"""The pipeline's shortlist: over a large pool, scorers rate at most `shortlist` candidates,
among them every backend a scorer nominates; filters narrow the shortlist, and see the whole
pool only when the shortlist holds none they keep; every plugin is timed once per pick."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import CandidateLoads
from fleetgate.routing.max_score import MaxScore
from fleetgate.routing.pipeline import RoutingPipeline
from fleetgate.routing.prefix_cache import PrefixCacheScorer
from fleetgate.routing.queue import QueueScorer
from fleetgate.routing.registry import PluginContext, default_registry

SYSTEM = b"You are a careful assistant; answer in French and cite sources. " * 16  # 8 blocks


def large_pool() -> tuple[BackendState, ...]:
    return tuple(
        BackendState(Backend(f"b{i}", f"http://10.0.{i // 256}.{i % 256}:8000", ("m",)))
        for i in range(1024)
    )


def asking(question: str, system: bytes = SYSTEM) -> RoutingRequest:
    return RoutingRequest("m", "chat", True, prompt=system + question.encode())


class Recording:
    """Scores every candidate 1 and remembers the candidates it was shown."""

    name = "recording"

    def __init__(self) -> None:
        self.seen: list[tuple[BackendState, ...]] = []

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        self.seen.append(tuple(candidates))
        return [1.0] * len(candidates)


def test_scorers_rate_a_random_shortlist_of_a_large_pool() -> None:
    pool = large_pool()
    recording = Recording()
    pipeline = RoutingPipeline(
        MaxScore(random.Random(0)), scorers=[(recording, 1.0)], shortlist=16, rng=random.Random(1)
    )
    for t in range(200):
        assert pipeline.pick(asking(str(t)), pool, float(t)) is not None
    assert len(recording.seen) == 200
    assert all(len(seen) == 16 and len(set(seen)) == 16 for seen in recording.seen)
    assert len({state for seen in recording.seen for state in seen}) > 900  # not a fixed few


def test_a_pool_within_the_shortlist_is_scored_whole() -> None:
    pool = large_pool()
    recording = Recording()
    pipeline = RoutingPipeline(MaxScore(random.Random(0)), scorers=[(recording, 1.0)])
    small = pool[:16]
    pipeline.pick(asking("q"), small, 0.0)
    assert recording.seen == [small]


def test_nominated_holders_are_always_in_the_shortlist_and_win() -> None:
    pool = large_pool()
    loads = CandidateLoads(MemoryLoadBoard())
    prefix, recording = PrefixCacheScorer(loads), Recording()
    pipeline = RoutingPipeline(
        MaxScore(random.Random(0)),
        scorers=[(prefix, 3.0), (QueueScorer(loads), 2.0), (recording, 1.0)],
        shortlist=16,
        rng=random.Random(2),
    )
    holder = pipeline.pick(asking("first"), pool, 0.0)
    assert holder is not None
    recording.seen.clear()
    for t in range(100):
        assert pipeline.pick(asking(f"question {t}"), pool, float(t)) is holder
    assert all(holder in seen and len(seen) <= 16 for seen in recording.seen)
    # A prefix held by three replicas brings all three into every shortlist.
    other = SYSTEM[::-1]
    replicas = pool[100], pool[500], pool[900]
    for state in replicas:
        prefix.chosen(asking("seed", other), state, 0.0)
    recording.seen.clear()
    for t in range(50):
        assert pipeline.pick(asking(f"q{t}", other), pool, 200.0 + t) in replicas
    assert all(set(replicas) <= set(seen) for seen in recording.seen)


class Only:
    """Keeps the backends of `ids`; remembers how many candidates it was shown."""

    name = "only"

    def __init__(self, *ids: str) -> None:
        self.ids = set(ids)
        self.shown: list[int] = []

    def filter(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> Sequence[BackendState]:
        self.shown.append(len(candidates))
        return [c for c in candidates if c.backend.id in self.ids]


def test_filters_narrow_the_shortlist_not_the_whole_pool() -> None:
    pool = large_pool()
    half = Only(*(f"b{i}" for i in range(0, 1024, 2)))
    recording = Recording()
    pipeline = RoutingPipeline(
        MaxScore(random.Random(0)),
        filters=[half],
        scorers=[(recording, 1.0)],
        shortlist=16,
        rng=random.Random(4),
    )
    for t in range(100):
        chosen = pipeline.pick(asking(str(t)), pool, float(t))
        assert chosen is not None and chosen.backend.id in half.ids
    assert half.shown == [16] * 100  # never a scan of the 1,024
    assert all(0 < len(seen) <= 16 for seen in recording.seen)


def test_a_filter_that_keeps_none_of_the_shortlist_is_given_the_whole_pool() -> None:
    pool = large_pool()
    rare = Only("b777")  # one backend of 1,024: almost never shortlisted
    pipeline = RoutingPipeline(
        MaxScore(random.Random(0)),
        filters=[rare],
        scorers=[(Recording(), 1.0)],
        shortlist=16,
        rng=random.Random(5),
    )
    calls: list[tuple[str, float]] = []
    pipeline.set_timer(lambda plugin, seconds: calls.append((plugin, seconds)), every=1)
    assert all(pipeline.pick(asking(str(t)), pool, float(t)) is pool[777] for t in range(20))
    assert 1024 in rare.shown  # the fallback scanned the pool
    # two passes of the filter in a pick, yet one timing of it per pick
    assert len(rare.shown) > 20 and [p for p, _ in calls].count("only") == 20
    pipeline.set_timer(None)
    assert pipeline.pick(asking("q"), pool, 30.0) is not None
    assert (
        RoutingPipeline(
            MaxScore(random.Random(0)), filters=[Only()], scorers=[(Recording(), 1.0)], shortlist=16
        ).pick(asking("q"), pool, 0.0)
        is None
    )  # none anywhere: no pick


PROFILE_PLUGINS = ("prefix_cache", "queue", "kv_cache", "max_score", "shortlist")


def timed_prefix_pipeline(
    calls: list[tuple[str, float]], board: MemoryLoadBoard | None = None
) -> RoutingPipeline:
    ctx = PluginContext(random.Random(3), board or MemoryLoadBoard())
    pipeline = default_registry().build_pipeline("prefix_cache", {}, ctx)
    pipeline.set_timer(lambda plugin, seconds: calls.append((plugin, seconds)), every=1)
    return pipeline


def test_the_timer_hears_once_from_every_plugin_on_every_pick() -> None:
    pool = large_pool()
    calls: list[tuple[str, float]] = []
    pipeline = timed_prefix_pipeline(calls)
    for t in range(10):
        pipeline.pick(asking(f"q{t}"), pool, float(t))
    counts = Counter(plugin for plugin, _ in calls)
    assert len(counts) == len(PROFILE_PLUGINS)
    assert set(counts.values()) == {10}
    assert all(seconds >= 0.0 for _, seconds in calls)
    calls.clear()
    pipeline.pick(asking("small pool"), pool[:8], 20.0)
    assert len(calls) == len(PROFILE_PLUGINS) - 1  # no shortlist to draw
    pipeline.set_timer(None)
    pipeline.pick(asking("untimed"), pool, 21.0)
    assert len(calls) == len(PROFILE_PLUGINS) - 1


def test_by_default_one_pick_in_sixteen_is_timed() -> None:
    pool = large_pool()
    calls: list[tuple[str, float]] = []
    ctx = PluginContext(random.Random(3), MemoryLoadBoard())
    pipeline = default_registry().build_pipeline("prefix_cache", {}, ctx)
    pipeline.set_timer(lambda plugin, seconds: calls.append((plugin, seconds)))
    for t in range(64):
        pipeline.pick(asking(f"q{t}"), pool, float(t))
    assert Counter(plugin for plugin, _ in calls) == dict.fromkeys(PROFILE_PLUGINS, 4)


def test_the_timer_names_each_plugin_as_the_config_does() -> None:
    pool = large_pool()
    calls: list[tuple[str, float]] = []
    pipeline = timed_prefix_pipeline(calls)
    pipeline.pick(asking("q"), pool, 0.0)
    assert sorted(plugin for plugin, _ in calls) == sorted(PROFILE_PLUGINS)


@pytest.mark.parametrize("timed", [False, True])
def test_the_prefix_profile_routes_a_held_prefix_back_among_1024_backends(timed: bool) -> None:
    pool = large_pool()
    calls: list[tuple[str, float]] = []
    board = MemoryLoadBoard()
    pipeline = timed_prefix_pipeline(calls, board)
    if not timed:
        pipeline.set_timer(None)
    holder = pipeline.pick(asking("first"), pool, 0.0)
    assert holder is not None
    board.begin(holder.backend.id, 0)  # busier than the rest, still within the guard
    picks = Counter(pipeline.pick(asking(f"question {t}"), pool, float(t)) for t in range(50))
    assert picks == {holder: 50}
    # Another prefix is not drawn to the busier holder: the queue scorer sends it elsewhere.
    newcomer = pipeline.pick(asking("first", SYSTEM[::-1]), pool, 60.0)
    assert newcomer is not None and newcomer is not holder
    assert bool(calls) is timed
