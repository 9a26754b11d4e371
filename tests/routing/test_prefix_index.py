"""The prefix index: longest matches per backend, LRU per backend, and bounded memory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from fleetgate.routing.prefix_index import (
    FINE_BLOCKS,
    PER_OCTAVE,
    REACH,
    WEIGHTS,
    MemoryPrefixIndex,
    block_hashes,
    entries_for,
)

SYSTEM = b"You are a careful assistant. " * 20  # 580 bytes: 4 blocks of 128


def test_hashes_chain_so_equal_hashes_mean_equal_prefixes() -> None:
    a = block_hashes(SYSTEM + b"question one", 128)
    b = block_hashes(SYSTEM + b"question two, longer than the other one" * 5, 128)
    assert a[:4] == b[:4] and len(a) == 4 and len(b) == 6  # 580 + 12, 580 + 195 bytes
    moved = block_hashes(b"x" + SYSTEM, 128)
    assert not set(moved) & set(a)  # same blocks at another offset do not match
    assert block_hashes(b"short", 128) == []


def test_matches_count_the_leading_blocks_each_backend_holds() -> None:
    index = MemoryPrefixIndex(1000)
    first = block_hashes(SYSTEM + b"a" * 300, 128)  # 6 blocks
    other = block_hashes(SYSTEM + b"b" * 300, 128)  # shares the first 4
    index.record("x", first)
    index.record("y", other)
    index.record("z", block_hashes(b"z" * 1000, 128))
    assert index.matches(first) == {"x": 6, "y": 4}
    assert index.matches(block_hashes(SYSTEM + b"c" * 300, 128)) == {"x": 4, "y": 4}
    assert index.matches(block_hashes(b"nothing shared" * 20, 128)) == {}


def test_each_backend_forgets_its_least_recently_used_blocks_first() -> None:
    index = MemoryPrefixIndex(1000)
    index.set_capacity("x", 3)  # room for 3 blocks
    assert index.capacity("x") == 3
    hot, cold, new = [1, 2], [3], [4]
    index.record("x", hot)
    index.record("x", cold)
    index.record("x", hot)  # touched again: now the most recent
    index.record("x", new)  # one over capacity: the coldest block goes
    assert index.matches(cold) == {}
    assert index.matches(hot) == {"x": 2} and index.matches(new) == {"x": 1}
    assert len(index) == 3


def test_the_entry_budget_is_shared_between_backends_and_forget_drops_one() -> None:
    index = MemoryPrefixIndex(10)
    for i, name in enumerate("abcde"):
        index.record(name, list(range(i * 100, i * 100 + 12)))  # 12 blocks of weight 1
    assert len(index) <= 10
    assert all(index.capacity(name) == 2 for name in "abcde")
    index.forget("a")
    assert index.matches([10, 11]) == {}
    assert index.matches([110, 111]) == {"b": 2}


def test_blocks_lengthen_along_the_prompt_and_weigh_their_length() -> None:
    assert WEIGHTS[:FINE_BLOCKS] == (1,) * FINE_BLOCKS
    assert WEIGHTS[FINE_BLOCKS : FINE_BLOCKS + PER_OCTAVE + 1] == (2,) * PER_OCTAVE + (4,)
    # 16 blocks of 128 bytes, then 8 of 256, 8 of 512, 8 of 1 KB, 8 of 2 KB and 3 of 4 KB
    # cover 45,056 of 48,000 bytes: each block is at most 1/8 of the prompt before it.
    hashes = block_hashes(b"x" * 48_000, 128)
    assert len(hashes) == 51 and REACH[51] * 128 == 45_056
    assert all(WEIGHTS[i] <= REACH[i] / 8 for i in range(FINE_BLOCKS, 300))
    index = MemoryPrefixIndex(1000)
    index.set_capacity("x", 21)  # blocks of 128 bytes
    # 16 x 1 + 2 x 2, and the unhashed rest of the prompt: half a next block (2) on average
    index.record("x", hashes[:18])
    assert index.matches(hashes) == {"x": 18}
    index.record("x", [7])  # one more: the oldest block (weight 1) goes
    assert index.matches(hashes) == {}
    index.record("x", hashes[:17])  # 17 blocks again: the 18th (2 + its rest) makes room
    assert index.matches(hashes) == {"x": 17} and index.matches([7]) == {"x": 1}
    assert len(index) == 18
    index.record("x", hashes[:4])  # within the first 16 blocks the rest is under a block
    assert index.matches(hashes) == {"x": 17} and len(index) == 18


MEMORY_PROBE = textwrap.dedent(
    """
    import sys
    from fleetgate.routing.prefix_index import MemoryPrefixIndex, entries_for
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096
    budget_mb = float(sys.argv[1])
    names = [f"10.0.0.{i}:8000" for i in range(8)]
    before = rss()
    index = MemoryPrefixIndex(entries_for(budget_mb))
    peak = 0
    for i in range(10_000_000):  # ten million distinct prompts
        h = (i * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        index.record(names[i & 7], [h])
        if i % 500_000 == 0:
            peak = max(peak, rss() - before)
    print(max(peak, rss() - before), len(index))
    """
)


def test_ten_million_distinct_prompts_stay_within_the_configured_memory() -> None:
    budget_mb = 24.0
    # glibc moves a large block between mmap and its heap by a threshold it adjusts as blocks
    # are freed, so where the index's dict tables land (and up to 5 MB of the RSS measured)
    # turned on the layout of unrelated objects: 22.3 or 27.2 MB for the very same index.
    # Its starting threshold, fixed, measures the index rather than that luck.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(budget_mb)],
        capture_output=True, text=True, check=True, timeout=100, env=env,
    ).stdout  # fmt: skip
    grown, entries = (int(x) for x in out.split())
    assert entries == entries_for(budget_mb) // 8 * 8  # full, and no fuller
    assert grown <= budget_mb * 1_000_000, f"grew {grown / 1e6:.1f} MB, budget {budget_mb} MB"


def test_blocks_of_one_length_weigh_one_each_wherever_they_start() -> None:
    index = MemoryPrefixIndex(1000, lengthening=False)  # an engine's blocks (kv_events)
    index.set_capacity("x", 40)
    index.record("x", list(range(40)))  # 40 blocks of one length: full, none lost
    assert index.matches(list(range(40))) == {"x": 40} and len(index) == 40
    index.record("x", [100])
    assert index.matches(list(range(40))) == {} and index.matches(list(range(1, 40)))["x"] == 39


def test_memory_bounds_the_number_of_hashes_and_the_engine_their_weight() -> None:
    hashes = block_hashes(b"y" * 10_000, 128)[:20]  # 16 x 1 + 4 x 2: weight 24 (25 with rest)
    index = MemoryPrefixIndex(20)  # one backend: a share of 20 hashes
    index.record("x", hashes)  # 20 hashes: within the share, whatever they weigh
    assert index.matches(hashes) == {"x": 20} and index.capacity("x") == 20
    index.set_capacity("x", 24)  # its engine holds 24 blocks: the rest of the prompt is over
    assert index.matches(hashes) == {} and index.capacity("x") == 20
    index.record("x", hashes[:16])  # its head again: the 17th block (weight 2) makes room
    assert index.matches(hashes) == {"x": 16} and len(index) == 19


def test_a_hash_list_longer_than_any_prompt_s_is_recorded_not_refused() -> None:
    # No prompt has so many blocks, but another gateway's entry in the shared stream may say
    # anything that decodes: it is kept to WEIGHTS' length, not raised on.
    index = MemoryPrefixIndex(100_000)
    hashes = list(range(len(WEIGHTS) + 40))
    index.record("x", hashes)
    assert index.matches(hashes) == {"x": len(WEIGHTS)}  # those past WEIGHTS are not kept
