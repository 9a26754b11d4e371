"""Which backends probably hold which prompt prefixes in their KV cache.

The gateway cannot see an engine's cache; it remembers where it sent each prompt. A prompt is
cut into blocks, and each block's hash chains every block before it:
    h_0 = xxh3_64(block_0),   h_i = xxh3_64(block_i, seed = h_(i-1))
so two prompts share h_i exactly when they share their first i + 1 blocks (up to hash
collisions, about 2^-64 per pair). A trailing partial block is not hashed: engines cache only
full blocks too.

Blocks lengthen along the prompt: the first `FINE_BLOCKS` are `block_bytes` long, then each
further `PER_OCTAVE` blocks are twice as long as the ones before (`WEIGHTS[i]`: block i's length
in `block_bytes`), so a block is at most 1/8 of the prompt before it. A match is then known to
1/8 of its depth, which is all the scorer's share of the prompt needs, and a 12,000-token
prompt is 44 blocks of 256 bytes from 188: recording and hashing it cost a fourth as much.

Each backend has an LRU of the block hashes routed to it, bounded twice: their weight (their
length in blocks of `block_bytes`) by the engine's KV capacity in those blocks when it reports
one (tokens x 4 bytes / block_bytes: the prefix_cache scorer converts), and their number by the
backend's share of `max_entries`. So the index forgets what the engine has most likely evicted,
and its memory is bounded: at most `max_entries` (hash, backend) pairs, about `ENTRY_BYTES` each
(tests/routing/test_prefix_index.py measures it with 10 million prompts). A dict maps each hash
to a bitmask of the backends holding it, so a lookup costs O(blocks) whatever the number of
backends.

`MemoryPrefixIndex` is the index in this process's memory, keyed by backend id: the
`PrefixIndex` protocol's in-process implementation (routing/stores.py).
"""

from __future__ import annotations

import itertools
import sys
from collections import OrderedDict
from collections.abc import Iterable

from xxhash import xxh3_64_intdigest

# Memory per (hash, backend) pair: 340 to 580 bytes measured (RSS, 10M prompts), by where
# glibc puts the dicts' tables (tests/routing/test_prefix_index.py).
ENTRY_BYTES = 512

FINE_BLOCKS = 16  # blocks of `block_bytes` at the prompt's start
PER_OCTAVE = 8  # blocks past those for each doubling of their length
# Block i's length in block_bytes (its weight in a backend's capacity), and the length of the
# first i blocks (REACH[i]), far past any prompt's end (2^40 blocks).
WEIGHTS = tuple([1] * FINE_BLOCKS + [2 << (i // PER_OCTAVE) for i in range(40 * PER_OCTAVE)])
REACH = tuple(itertools.accumulate(WEIGHTS, initial=0))
# The layout of `block_hashes`' lists: gateways share decisions only with gateways of the same
# one (shared/prefix_index.py). 2: lengthening blocks; 1 was blocks of one length.
LAYOUT = 2


def block_hashes(prompt: bytes | memoryview, block_bytes: int) -> list[int]:
    """The chained hashes of the prompt's full blocks, in order (module docstring)."""
    view = memoryview(prompt)
    size = len(view)
    hashes: list[int] = []
    h = start = 0
    for weight in WEIGHTS:
        end = start + weight * block_bytes
        if end > size:
            break
        h = xxh3_64_intdigest(view[start:end], h)
        hashes.append(h)
        start = end
    return hashes


class MemoryPrefixIndex:
    """Block hashes per backend id (LRU, bounded) and, per hash, the backends holding it."""

    __slots__ = (
        "_caps", "_held", "_lrus", "_max_entries", "_owners", "_share", "_slots", "_weights",
        "members",
    )  # fmt: skip

    def __init__(self, max_entries: int, *, lengthening: bool = True) -> None:
        """`lengthening`: the hashes recorded are `block_hashes`', each block weighing its
        length (`WEIGHTS`); else blocks of one length, weighing 1 each (kv_events/index.py:
        an engine's blocks, reported in runs from anywhere in a prompt)."""
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self._max_entries = max_entries
        self._weights = WEIGHTS if lengthening else None
        self._owners: dict[int, int] = {}  # hash -> bitmask of backend slots
        self._slots: dict[str, int] = {}  # backend id -> its slot (bit)
        self.members: list[str] = []  # slot -> backend id
        self._lrus: list[OrderedDict[int, int]] = []  # slot -> its hashes, oldest first: weight
        self._held: list[int] = []  # slot -> the weight of its hashes
        self._caps: list[int] = []  # slot -> the weight it may hold: its engine's KV cache
        self._share = max_entries  # the hashes each backend may hold: its share of the budget

    def __len__(self) -> int:
        """(hash, backend) pairs held."""
        return sum(len(lru) for lru in self._lrus)

    def _slot(self, backend: str) -> int:
        slot = self._slots.get(backend)
        if slot is None:
            slot = self._slots[backend] = len(self.members)
            self.members.append(backend)
            self._lrus.append(OrderedDict())
            self._held.append(0)
            self._caps.append(sys.maxsize)  # no bound but the share until its engine reports
            self._rebalance()
        return slot

    def _rebalance(self) -> None:
        self._share = max(1, self._max_entries // len(self.members))
        for slot, cap in enumerate(self._caps):
            self._evict(slot, cap, self._share)

    def set_capacity(self, backend_id: str, blocks: int) -> None:
        """The engine's KV capacity in blocks of `block_bytes`: its LRU's weight stays within
        that (and the number of its hashes within its share of the budget)."""
        slot = self._slot(backend_id)
        self._caps[slot] = max(1, blocks)
        self._evict(slot, self._caps[slot], self._share)

    def capacity(self, backend_id: str) -> int:
        """The most hashes kept for the backend: its share, or its engine's capacity if less."""
        return min(self._caps[self._slot(backend_id)], self._share)

    def _mask_of(self, backends: Iterable[str]) -> int:
        """The bitmask of these backends' slots (backends the index never saw have none)."""
        slots = self._slots
        mask = 0
        for backend in backends:
            slot = slots.get(backend)
            if slot is not None:
                mask |= 1 << slot
        return mask

    def matches(self, hashes: list[int], among: Iterable[str] | None = None) -> dict[str, int]:
        """Per backend holding the first block (of `among`, or of all), how many leading
        blocks it holds. O(blocks + backends found), and O(len(among)) for the mask."""
        owners = self._owners
        if not hashes:
            return {}
        mask = owners.get(hashes[0], 0)
        if among is not None:
            mask &= self._mask_of(among)
        if not mask:
            return {}
        found: dict[str, int] = {}
        depth = 1
        for h in hashes[1:]:
            narrower = mask & owners.get(h, 0)
            if narrower != mask:
                self._credit(mask & ~narrower, depth, found)
                if not narrower:
                    return found
                mask = narrower
            depth += 1
        self._credit(mask, depth, found)
        return found

    def deepest(self, hashes: list[int], limit: int) -> list[str]:
        """Up to `limit` of the backends holding the longest held prefix. O(blocks + limit)."""
        owners = self._owners
        mask = owners.get(hashes[0], 0) if hashes else 0
        for h in hashes[1:]:
            narrower = mask & owners.get(h, 0)
            if not narrower:
                break
            mask = narrower
        found: list[str] = []
        members = self.members
        while mask and len(found) < limit:
            low = mask & -mask
            found.append(members[low.bit_length() - 1])
            mask ^= low
        return found

    def _credit(self, mask: int, depth: int, found: dict[str, int]) -> None:
        members = self.members
        while mask:
            low = mask & -mask
            found[members[low.bit_length() - 1]] = depth
            mask ^= low

    def record(self, backend_id: str, hashes: list[int]) -> None:
        """The backend was sent a prompt with these block hashes: it now caches them."""
        slot = self._slot(backend_id)
        lru = self._lrus[slot]
        owners = self._owners
        bit = 1 << slot
        held = self._held[slot]
        weights = self._weights
        for h, weight in zip(hashes, weights or itertools.repeat(1), strict=False):
            if h in lru:  # (WEIGHTS reaches past any prompt's end)
                lru.move_to_end(h)
            else:
                lru[h] = weight
                held += weight
                owners[h] = owners.get(h, 0) | bit
        # The engine caches the prompt's unhashed rest too: half a next block on average, which
        # the last block counts once (it would otherwise hold the index above its engine). A
        # list longer than WEIGHTS (no prompt's: a peer's bad entry) is kept to its length.
        if weights and 0 < len(hashes) < len(weights) and weights[len(hashes)] > 1:
            last, counted = hashes[-1], weights[len(hashes) - 1]
            if lru[last] == counted:
                rest = weights[len(hashes)] // 2
                lru[last] = counted + rest
                held += rest
        self._held[slot] = held
        if held > self._caps[slot] or len(lru) > self._share:
            self._evict(slot, self._caps[slot], self._share)

    def drop(self, backend_id: str, hashes: Iterable[int]) -> None:
        """The backend no longer holds these blocks (its engine said it evicted them)."""
        slot = self._slots.get(backend_id)
        if slot is None:
            return
        lru, owners, keep = self._lrus[slot], self._owners, ~(1 << slot)
        for h in hashes:
            weight = lru.pop(h, 0)
            if weight:
                self._held[slot] -= weight
                mask = owners[h] & keep
                if mask:
                    owners[h] = mask
                else:
                    del owners[h]

    def _evict(self, slot: int, cap: int, share: int) -> None:
        """The slot's oldest hashes go until their weight is within `cap` and their number
        within `share`."""
        lru, owners = self._lrus[slot], self._owners
        keep = ~(1 << slot)
        held = self._held[slot]
        while held > cap or len(lru) > share:
            h, weight = lru.popitem(last=False)
            held -= weight
            mask = owners[h] & keep
            if mask:
                owners[h] = mask
            else:
                del owners[h]
        self._held[slot] = held

    def forget(self, backend_id: str) -> None:
        """Drop everything recorded for the backend (removed, or its engine restarted)."""
        slot = self._slots.get(backend_id)
        if slot is None:
            return
        self._evict(slot, 0, 0)


def entries_for(memory_mb: float) -> int:
    """How many (hash, backend) pairs fit in `memory_mb` megabytes."""
    return max(1, int(memory_mb * 1_000_000 // ENTRY_BYTES))
