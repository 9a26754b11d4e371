"""The `prefix_cache` profile: prompts follow their cached prefix, unless its holder's queue is
longer than balance_rel * q_min + balance_abs; then the prefix spreads to another replica."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.engine_load import EngineLoad
from fleetgate.fleet.pool import Pool
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.pipeline import RoutingPipeline
from fleetgate.routing.prefix_cache import PrefixCacheScorer
from fleetgate.routing.prefix_index import block_hashes, entries_for
from fleetgate.routing.registry import PluginContext, PluginSpec, Profile, default_registry
from fleetgate.routing.router import Router

BLOCK = 128  # the scorer's default block_bytes
SYSTEM = b"You are a careful assistant; answer in French and cite sources. " * 32  # 16 blocks


def system_prompt(i: int) -> bytes:
    """A 16-block system prompt of its own: it differs from the others in the first block."""
    head = f"[tenant {i:03}] ".encode()
    return head + SYSTEM[len(head) :]


def asking(system: bytes, question: str) -> RoutingRequest:
    """A chat request: the system prompt, then a question shorter than a block."""
    return RoutingRequest("m", "chat", True, prompt=system + question.encode())


def prefix_router(n: int, seed: int = 1) -> tuple[Router, PrefixCacheScorer]:
    """A pool of n backends routed by the shipped `prefix_cache` profile, and its index."""
    states = [
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",))) for i in range(n)
    ]
    pool = Pool("m", states)
    ctx = PluginContext(random.Random(seed), pool.board)
    pipeline = default_registry().build_pipeline("prefix_cache", {}, ctx)
    return Router(pool, pipeline), prefix_scorer(pipeline)


def prefix_scorer(pipeline: RoutingPipeline) -> PrefixCacheScorer:
    # The pipeline does not hand out its plugins; the test reads the index behind the profile.
    found = [s for s in pipeline.scorers if isinstance(s, PrefixCacheScorer)]
    assert len(found) == 1
    return found[0]


def sent(router: Router, request: RoutingRequest, now: float = 0.0) -> BackendState:
    """Routes the request and leaves it in flight."""
    state = router.pick(request, now)
    assert state is not None
    router.pool.begin(state.backend.id, now)
    return state


def test_requests_sharing_a_long_system_prompt_stick_to_the_backend_that_first_got_them() -> None:
    router, _ = prefix_router(4)
    pool = router.pool
    holder = sent(router, asking(SYSTEM, "What is a monad?"))
    pool.end(holder.backend.id, 0.0)
    for i in range(30):
        assert sent(router, asking(SYSTEM, f"question {i}?"), 1.0) is holder
        pool.end(holder.backend.id, 1.0)


def test_the_holder_keeps_its_prefix_while_its_queue_is_within_the_guard() -> None:
    router, scorer = prefix_router(4)
    holder = sent(router, asking(SYSTEM, "first"))
    # The others stay empty: the holder takes the prefix while it has at most 1.5 * 0 + 32 = 32
    # in flight, though the queue scorer prefers the empty ones all along.
    for i in range(32):
        assert sent(router, asking(SYSTEM, f"question {i}"), 1.0) is holder
    assert router.pool.board.load(holder.backend.id).in_flight == 33
    spilled = sent(router, asking(SYSTEM, "one too many"), 1.0)
    assert spilled is not holder
    hashes = block_hashes(asking(SYSTEM, "any").prompt, BLOCK)
    assert scorer.index.matches(hashes) == {holder.backend.id: 16, spilled.backend.id: 16}


def test_the_first_prefix_goes_where_the_load_scorers_send_it_and_is_recorded() -> None:
    router, scorer = prefix_router(4)
    request = asking(SYSTEM, "hello")
    hashes = block_hashes(request.prompt, BLOCK)
    assert scorer.index.matches(hashes) == {}
    assert scorer.nominate(request, 0.0) == []
    holder = sent(router, request)
    assert scorer.index.matches(hashes) == {holder.backend.id: 16}
    assert scorer.nominate(asking(SYSTEM, "other question"), 0.0) == [holder.backend.id]


def test_different_prefixes_spread_over_the_backends_and_each_keeps_its_home() -> None:
    router, _ = prefix_router(4)
    pool = router.pool
    homes = {i: sent(router, asking(system_prompt(i), "hi")) for i in range(8)}
    assert Counter(homes.values()) == dict.fromkeys(pool.states, 2)
    for state, load in pool.loads():
        while load.in_flight:
            pool.end(state.backend.id, 1.0)
    for i in range(8):
        assert router.pick(asking(system_prompt(i), "next question"), 2.0) is homes[i]


def test_the_load_guard_spreads_a_hot_prefix_to_a_second_replica() -> None:
    router, scorer = prefix_router(4)
    pool = router.pool
    holder = sent(router, asking(SYSTEM, "first"))
    pool.end(holder.backend.id, 0.0)
    others = [s for s in pool.states if s is not holder]
    for state in others:  # q_min = 2: the guard's limit is 1.5 * 2 + 32 = 35
        pool.begin(state.backend.id, 0.0)
        pool.begin(state.backend.id, 0.0)
    holder.engine = EngineLoad(4, 31, 0.5, 0.0, 0.0, None, scraped_at=10.0)  # q = 35
    assert router.pick(asking(SYSTEM, "at the limit"), 10.0) is holder
    holder.engine = EngineLoad(4, 32, 0.5, 0.0, 0.0, None, scraped_at=10.0)  # q = 36
    second = router.pick(asking(SYSTEM, "over the limit"), 10.0)
    assert second is not None and second is not holder
    hashes = block_hashes(asking(SYSTEM, "any").prompt, BLOCK)
    assert scorer.index.matches(hashes) == {holder.backend.id: 16, second.backend.id: 16}
    assert set(scorer.nominate(asking(SYSTEM, "any"), 10.0)) == {
        holder.backend.id,
        second.backend.id,
    }
    # While the holder stays over the limit, the prefix follows its second replica, not a third.
    picks = {router.pick(asking(SYSTEM, f"more {i}"), 10.5) for i in range(10)}
    assert picks == {second}


def test_an_engine_reported_kv_capacity_shrinks_its_share_of_the_index() -> None:
    router, scorer = prefix_router(2)
    pool = router.pool
    small, big = pool.states
    small.engine = EngineLoad(0, 0, 0.0, 0.0, 0.0, None, 0.0, kv_capacity_tokens=1024)
    sent(router, asking(SYSTEM, "warm up"))
    assert (
        scorer.index.capacity(small.backend.id) == 1024 * 4 // BLOCK
    )  # 32 blocks: two system prompts
    assert scorer.index.capacity(big.backend.id) == entries_for(64.0) // 2
    # Three 16-block prefixes sent to `small` alone: the first is forgotten, as the engine would.
    first, second, third = (asking(system_prompt(i), "q") for i in range(3))
    for request in (first, second, third):
        assert router.pipeline.pick(request, (small,), 1.0) is small
    assert small.backend.id not in scorer.index.matches(block_hashes(first.prompt, BLOCK))
    assert scorer.index.matches(block_hashes(third.prompt, BLOCK)) == {small.backend.id: 16}
    # An engine restarted with a larger cache gets a larger share.
    small.engine = EngineLoad(0, 0, 0.0, 0.0, 0.0, None, 2.0, kv_capacity_tokens=4096)
    router.pick(asking(SYSTEM, "after restart"), 2.0)
    assert scorer.index.capacity(small.backend.id) == 4096 * 4 // BLOCK


@pytest.mark.parametrize(
    ("backends", "kv_tokens", "block"),
    [(8, 430_000, 128), (16, 430_000, 256), (100, 470_000, 2048), (1000, 10**9, 2048)],
)
def test_in_a_large_pool_blocks_grow_until_each_share_of_the_index_covers_a_cache(
    backends: int, kv_tokens: int, block: int
) -> None:
    router, scorer = prefix_router(backends)
    for state in router.pool.states:
        state.engine = EngineLoad(0, 0, 0.0, 0.0, 0.0, None, 0.0, kv_capacity_tokens=kv_tokens)
    for i in range(300):  # a large pool's picks score a shortlist: each backend comes up
        router.pick(asking(system_prompt(i), "q"), 0.0)
    long_prompt = asking(SYSTEM * 40, "q")  # 640 blocks of 128 bytes
    home = sent(router, long_prompt)
    assert scorer.block_bytes == block
    hashes = block_hashes(long_prompt.prompt, block)
    assert scorer.index.matches(hashes) == {home.backend.id: len(hashes)}
    share = entries_for(64.0) // backends
    assert scorer.index.capacity(home.backend.id) == min(share, kv_tokens * 4 // block)
    assert router.pick(asking(SYSTEM * 40, "again"), 1.0) is home  # its prefix, in big blocks


@pytest.mark.parametrize(
    "params",
    [{"memory_mb": 0}, {"block_bytes": 8}, {"balance_abs": -1}, {"balance_rel": 0.5}],
)
def test_nonsense_parameters_are_refused(params: dict[str, float]) -> None:
    profile = Profile(((PluginSpec("prefix_cache", params), 1.0),))
    (field,) = params
    with pytest.raises(ValueError, match=f"prefix_cache: `{field}` must be"):
        default_registry().build_profile(
            profile, PluginContext(random.Random(0), Pool("m", []).board)
        )
