"""The `queue` and `kv_cache` scorers, and the `least_loaded` profile they make up.

queue:    score_i = 1 - r_i / max_j r_j,  r_i = max(gateway in-flight, running + waiting) / weight
kv_cache: score_i = 1 - k_i / max_j k_j,  k_i = the engine's reading + prompt tokens sent since
          it / capacity; a missing or stale reading counts as the mean of the others
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.engine_load import EngineLoad
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.kv_cache import KvCacheScorer
from fleetgate.routing.load import CandidateLoads
from fleetgate.routing.queue import QueueScorer
from fleetgate.routing.router import Router

MakeRouter = Callable[[str, Sequence[float]], Router]
REQUEST = RoutingRequest("m", "chat", stream=False)


def states(n: int) -> tuple[BackendState, ...]:
    return tuple(
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",))) for i in range(n)
    )


def sent(board: MemoryLoadBoard, state: BackendState, requests: int) -> None:
    """`requests` sent to `state` by the gateway, as its accounting counts them."""
    for _ in range(requests):
        board.begin(state.backend.id, 0)


def reading(
    running: float = 0.0,
    waiting: float = 0.0,
    kv: float = 0.0,
    at: float = 0.0,
    capacity: float | None = None,
    sent: int = 0,
) -> EngineLoad:
    """An engine's scrape at time `at`, when the gateway had `sent` prompt tokens in flight."""
    return EngineLoad(running, waiting, kv, 0.0, 0.0, None, at, capacity, sent)


def test_queue_takes_the_larger_of_the_engine_reading_and_the_gateway_count() -> None:
    a, b, c, d = states(4)
    board = MemoryLoadBoard()
    sent(board, a, 2)
    a.engine = reading(running=6, waiting=2)  # other clients: the engine's 8
    sent(board, b, 4)
    b.engine = reading(running=1, waiting=0)  # sent since the scrape: 4
    sent(board, c, 2)  # never scraped: the gateway's 2
    d.engine = reading()  # idle
    scores = QueueScorer(CandidateLoads(board)).score(REQUEST, (a, b, c, d), now=1.0)
    assert scores == pytest.approx([0.0, 0.5, 0.75, 1.0])


def test_a_stale_engine_reading_is_ignored_for_the_gateway_count() -> None:
    a, b = states(2)
    board = MemoryLoadBoard()
    sent(board, a, 1)
    a.engine = reading(running=9, waiting=1, at=0.0)
    sent(board, b, 2)
    scorer = QueueScorer(CandidateLoads(board))
    assert scorer.score(REQUEST, (a, b), now=5.0) == pytest.approx([0.0, 0.8])
    # 5.5 s later the reading is older than the default 5 s: a counts its own 1 only.
    assert scorer.score(REQUEST, (a, b), now=5.5) == pytest.approx([0.5, 0.0])
    # A scorer configured to trust older readings still uses it.
    trusting = QueueScorer(CandidateLoads(board), stale_after_s=10.0)
    assert trusting.score(REQUEST, (a, b), now=5.5) == pytest.approx([0.0, 0.8])


def test_queue_is_weighed_by_each_backends_weight(make_router: MakeRouter) -> None:
    pool = make_router("round_robin", [2.5, 1.0, 1.0]).pool
    h100, a100, other = pool.states
    for state, requests in ((h100, 5), (a100, 2), (other, 4)):  # 2 a unit of weight, 2, 4
        for _ in range(requests):
            pool.begin(state.backend.id, 0.0)
    scorer = QueueScorer(CandidateLoads(pool.board))
    assert scorer.score(REQUEST, pool.states, now=0.0) == pytest.approx([0.5, 0.5, 0.0])


def test_every_queue_scores_one_when_all_are_empty() -> None:
    a, b, c = states(3)
    b.engine = reading(at=0.0)
    scorer = QueueScorer(CandidateLoads(MemoryLoadBoard()))
    assert scorer.score(REQUEST, (a, b, c), now=0.0) == [1.0, 1.0, 1.0]


def test_kv_cache_scores_free_cache_and_missing_readings_get_the_mean() -> None:
    a, b, c, d = states(4)
    a.engine = reading(kv=0.2)
    b.engine = reading(kv=0.6)
    d.engine = reading(kv=0.1, at=-10.0)  # stale: as good as missing
    # relative to the fullest (0.6); c and d count as the mean of the fresh readings, 0.4
    scores = KvCacheScorer(CandidateLoads(MemoryLoadBoard())).score(REQUEST, (a, b, c, d), 0.0)
    assert scores == pytest.approx([2 / 3, 0.0, 1 / 3, 1 / 3])


def test_kv_cache_counts_prompts_sent_and_finished_since_the_reading(
    make_router: MakeRouter,
) -> None:
    pool = make_router("round_robin", [1.0, 1.0]).pool
    a, b = pool.states
    pool.begin(a.backend.id, 0.0, prompt_tokens=4_000)
    pool.begin(b.backend.id, 0.0, prompt_tokens=2_000)
    # Both read 10% of 100k tokens, with the gateway's prompts above already in them.
    a.engine = reading(kv=0.1, capacity=100_000, sent=4_000)
    b.engine = reading(kv=0.1, capacity=100_000, sent=2_000)
    scorer = KvCacheScorer(CandidateLoads(pool.board))
    assert scorer.score(REQUEST, (a, b), now=0.5) == pytest.approx([0.0, 0.0])
    pool.begin(b.backend.id, 0.5, prompt_tokens=10_000)  # sent since: b holds 20% now
    pool.end(a.backend.id, 0.5, prompt_tokens=4_000)  # finished since: a holds 6%
    assert scorer.score(REQUEST, (a, b), now=0.6) == pytest.approx([0.7, 0.0])
    # Without a reported capacity, the reading alone counts.
    a.engine = reading(kv=0.1)
    b.engine = reading(kv=0.2)
    assert scorer.score(REQUEST, (a, b), now=0.6) == pytest.approx([0.5, 0.0])


def test_kv_cache_clamps_readings_and_scores_one_without_any() -> None:
    a, b, c = states(3)
    scorer = KvCacheScorer(CandidateLoads(MemoryLoadBoard()))
    assert scorer.score(REQUEST, (a, b, c), now=0.0) == [1.0, 1.0, 1.0]
    a.engine = reading(kv=1.3)  # engines overshoot their own percentages briefly
    b.engine = reading(kv=-0.1)
    assert scorer.score(REQUEST, (a, b, c), now=0.0) == pytest.approx([0.0, 1.0, 0.5])


def test_least_loaded_routes_to_the_idle_engine(make_router: MakeRouter) -> None:
    router = make_router("least_loaded", [1.0, 1.0, 1.0, 1.0])
    pool = router.pool
    b0, b1, b2, b3 = pool.states
    b0.engine = reading(running=12, waiting=3, kv=0.9, at=10.0)
    b1.engine = reading(running=8, waiting=0, kv=0.7, at=10.0)
    b2.engine = reading(running=0, waiting=0, kv=0.05, at=10.0)  # idle
    b3.engine = reading(running=10, waiting=1, kv=0.8, at=10.0)
    picks = Counter(router.pick(REQUEST, now=11.0) for _ in range(20))
    assert picks == {b2: 20}


def test_least_loaded_counts_requests_sent_since_the_last_scrape(make_router: MakeRouter) -> None:
    router = make_router("least_loaded", [1.0, 1.0])
    pool = router.pool
    b0, b1 = pool.states
    b0.engine = reading(running=2, kv=0.3, at=10.0)
    b1.engine = reading(running=0, kv=0.3, at=10.0)  # idle when scraped ...
    for _ in range(5):
        pool.begin(b1.backend.id, 10.5)  # ... but the gateway has sent it five since
    assert router.pick(REQUEST, now=11.0) is b0
    b0.engine = reading(running=2, kv=0.3, at=0.0)
    b1.engine = reading(running=0, kv=0.3, at=0.0)
    pool.begin(b0.backend.id, 10.5)
    # Both readings stale: only the gateway's counts (1 against 5) remain.
    assert router.pick(REQUEST, now=11.0) is b0
