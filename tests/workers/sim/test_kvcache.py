"""KV blocks: allocation, reference counts, prefix reuse, LRU eviction, usage."""

from __future__ import annotations

import pytest

from fleetgate.workers.sim.kvcache import BlockManager

HASHES_A = (101, 102, 103)
HASHES_B = (201, 202, 203)


def test_allocate_reserves_whole_blocks_and_usage_follows() -> None:
    kv = BlockManager(num_blocks=10, block_size=4)
    assert kv.allocate("a", HASHES_A, num_tokens=9, num_cached_blocks=0, query_tokens=9)
    assert len(kv.block_ids("a")) == 3  # 9 tokens -> ceil(9 / 4)
    assert kv.num_free_blocks == 7
    assert kv.usage == pytest.approx(0.3)
    kv.free("a")
    assert kv.num_free_blocks == 10
    assert kv.usage == 0.0


def test_allocate_fails_without_change_when_short() -> None:
    kv = BlockManager(num_blocks=4, block_size=4)
    assert kv.allocate("a", (), num_tokens=12, num_cached_blocks=0, query_tokens=12)
    assert not kv.allocate("b", (), num_tokens=8, num_cached_blocks=0, query_tokens=8)
    assert kv.num_free_blocks == 1
    with pytest.raises(KeyError):
        kv.block_ids("b")


def test_append_slots_grows_only_across_a_block_boundary() -> None:
    kv = BlockManager(num_blocks=3, block_size=4)
    kv.allocate("a", (), num_tokens=3, num_cached_blocks=0, query_tokens=3)
    assert kv.append_slots("a", 4)
    assert len(kv.block_ids("a")) == 1
    assert kv.append_slots("a", 5)
    assert len(kv.block_ids("a")) == 2
    assert kv.append_slots("a", 12)
    assert not kv.append_slots("a", 13)  # all three blocks held
    assert len(kv.block_ids("a")) == 3


def test_cached_prefix_is_shared_with_reference_counts() -> None:
    kv = BlockManager(num_blocks=10, block_size=4)
    kv.allocate("a", HASHES_A, num_tokens=13, num_cached_blocks=0, query_tokens=13)
    assert kv.match_prefix(HASHES_A) == 3
    assert kv.match_prefix(HASHES_A, max_blocks=2) == 2
    assert kv.match_prefix((101, 999, 103)) == 1  # a miss ends the prefix

    assert kv.allocate("b", HASHES_A, num_tokens=13, num_cached_blocks=2, query_tokens=13)
    a, b = kv.block_ids("a"), kv.block_ids("b")
    assert a[:2] == b[:2]
    assert set(a[2:]).isdisjoint(b[2:])
    assert [kv.ref_count(x) for x in b] == [2, 2, 1, 1]
    assert kv.num_free_blocks == 10 - 4 - 2
    assert (kv.prefix_queries_tokens, kv.prefix_hits_tokens) == (26, 8)

    kv.free("a")
    assert [kv.ref_count(x) for x in b] == [1, 1, 1, 1]


def test_freed_hashed_blocks_stay_findable_until_evicted() -> None:
    kv = BlockManager(num_blocks=6, block_size=4)
    kv.allocate("a", HASHES_A, num_tokens=12, num_cached_blocks=0, query_tokens=12)
    kv.free("a")
    assert kv.num_free_blocks == 6
    assert kv.match_prefix(HASHES_A) == 3

    # Three never-used blocks remain, so a new sequence takes those and evicts nothing.
    kv.allocate("b", (), num_tokens=12, num_cached_blocks=0, query_tokens=12)
    assert kv.match_prefix(HASHES_A) == 3

    # Reusing a freed cached block takes it out of the free pool.
    kv.allocate("c", HASHES_A, num_tokens=12, num_cached_blocks=3, query_tokens=12)
    assert kv.num_free_blocks == 0
    kv.free("c")
    kv.free("b")


def test_eviction_takes_least_recently_freed_and_tail_blocks_first() -> None:
    kv = BlockManager(num_blocks=6, block_size=4)
    kv.allocate("a", HASHES_A, num_tokens=12, num_cached_blocks=0, query_tokens=12)
    kv.allocate("b", HASHES_B, num_tokens=12, num_cached_blocks=0, query_tokens=12)
    kv.free("a")  # freed first: evicted first
    kv.free("b")

    kv.allocate("c", (), num_tokens=4, num_cached_blocks=0, query_tokens=4)
    assert kv.match_prefix(HASHES_A) == 2  # a's tail block went first
    kv.allocate("d", (), num_tokens=8, num_cached_blocks=0, query_tokens=8)
    assert kv.match_prefix(HASHES_A) == 0
    assert kv.match_prefix(HASHES_B) == 3
    kv.allocate("e", (), num_tokens=4, num_cached_blocks=0, query_tokens=4)
    assert kv.match_prefix(HASHES_B) == 2


def test_partial_block_is_not_cached_until_full() -> None:
    kv = BlockManager(num_blocks=4, block_size=4)
    kv.allocate("a", HASHES_A, num_tokens=6, num_cached_blocks=0, query_tokens=6)
    assert kv.match_prefix(HASHES_A) == 1
    kv.append_slots("a", 9)  # block 1 is now full; block 2 holds one token
    assert kv.match_prefix(HASHES_A) == 2
    assert kv.num_cached_blocks == 2


def test_reset_prefix_cache_only_when_idle() -> None:
    kv = BlockManager(num_blocks=4, block_size=4)
    kv.allocate("a", HASHES_A, num_tokens=8, num_cached_blocks=0, query_tokens=8)
    assert not kv.reset_prefix_cache()
    kv.free("a")
    assert kv.reset_prefix_cache()
    assert kv.match_prefix(HASHES_A) == 0
    assert kv.num_free_blocks == 4


def test_double_allocate_is_an_error() -> None:
    kv = BlockManager(num_blocks=4, block_size=4)
    kv.allocate("a", (), num_tokens=1, num_cached_blocks=0, query_tokens=1)
    with pytest.raises(ValueError, match="already holds"):
        kv.allocate("a", (), num_tokens=1, num_cached_blocks=0, query_tokens=1)


def test_received_blocks_are_cached_and_never_evict_each_other() -> None:
    from fleetgate.workers.sim.kvcache import BlockManager

    kv = BlockManager(num_blocks=4, block_size=2)
    assert kv.receive([11, 12, 13]) == 3
    assert kv.match_prefix([11, 12, 13, 14]) == 3
    assert kv.num_free_blocks == 4  # cached but free: evictable when blocks are needed
    assert kv.receive([21, 22, 23, 24, 25]) == 4  # the 5th would evict one just received
    assert kv.match_prefix([11]) == 0  # the older transfer was evicted, oldest first
    assert kv.match_prefix([21, 22, 23, 24, 25]) == 4
