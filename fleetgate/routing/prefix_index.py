"""Which backends probably hold which prompt prefixes in their KV cache.

The gateway cannot see an engine's cache; it remembers where it sent each prompt. A prompt is
cut into blocks of `block_bytes`, and each block's hash chains every block before it:
    h_0 = xxh3_64(block_0),   h_i = xxh3_64(block_i, seed = h_(i-1))
so two prompts share h_i exactly when they share their first i + 1 blocks (up to hash
collisions, about 2^-64 per pair). A trailing partial block is not hashed: engines cache only
full blocks too.

Each backend has an LRU of the block hashes routed to it, at most `capacity` of them: the
engine's KV capacity in gateway blocks when it reports one (tokens x 4 bytes / block_bytes:
the prefix_cache scorer converts), never more than its share of `max_entries`. So the index
forgets what the engine has most likely evicted, and its memory is bounded: at most
`max_entries` (hash, backend) pairs, about `ENTRY_BYTES` each (tests/routing/test_prefix_index.py
measures it with 10 million prompts). A dict maps each hash to a bitmask of the backends
holding it, so a lookup costs O(blocks) whatever the number of backends.

`MemoryPrefixIndex` is the index in this process's memory, keyed by backend id: the
`PrefixIndex` protocol's in-process implementation (routing/stores.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from xxhash import xxh3_64_intdigest

# Memory per (hash, backend) pair: 340 to 580 bytes measured (RSS, 10M prompts), by where
# glibc puts the dicts' tables (tests/routing/test_prefix_index.py).
ENTRY_BYTES = 512


def block_hashes(prompt: bytes | memoryview, block_bytes: int) -> list[int]:
    """The chained hashes of the prompt's full blocks, in order."""
    view = memoryview(prompt)
    hashes: list[int] = []
    h = 0
    for start in range(0, len(view) - block_bytes + 1, block_bytes):
        h = xxh3_64_intdigest(view[start : start + block_bytes], h)
        hashes.append(h)
    return hashes


class MemoryPrefixIndex:
    """Block hashes per backend id (LRU, bounded) and, per hash, the backends holding it."""

    __slots__ = ("_caps", "_lrus", "_max_entries", "_owners", "_slots", "members")

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self._max_entries = max_entries
        self._owners: dict[int, int] = {}  # hash -> bitmask of backend slots
        self._slots: dict[str, int] = {}  # backend id -> its slot (bit)
        self.members: list[str] = []  # slot -> backend id
        self._lrus: list[OrderedDict[int, None]] = []
        self._caps: list[int] = []

    def __len__(self) -> int:
        """(hash, backend) pairs held."""
        return sum(len(lru) for lru in self._lrus)

    def _slot(self, backend: str) -> int:
        slot = self._slots.get(backend)
        if slot is None:
            slot = self._slots[backend] = len(self.members)
            self.members.append(backend)
            self._lrus.append(OrderedDict())
            self._caps.append(0)
            self._rebalance()
        return slot

    def _rebalance(self) -> None:
        share = max(1, self._max_entries // len(self.members))
        for slot, cap in enumerate(self._caps):
            self._caps[slot] = min(cap, share) if cap else share
            self._evict(slot)

    def set_capacity(self, backend_id: str, blocks: int) -> None:
        """The engine's KV capacity in blocks: its LRU holds no more than that (nor more than
        its share of the budget)."""
        slot = self._slot(backend_id)
        share = max(1, self._max_entries // len(self.members))
        self._caps[slot] = max(1, min(share, blocks))
        self._evict(slot)

    def capacity(self, backend_id: str) -> int:
        return self._caps[self._slot(backend_id)]

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
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                owners[h] = owners.get(h, 0) | bit
        if len(lru) > self._caps[slot]:
            self._evict(slot)

    def drop(self, backend_id: str, hashes: Iterable[int]) -> None:
        """The backend no longer holds these blocks (its engine said it evicted them)."""
        slot = self._slots.get(backend_id)
        if slot is None:
            return
        lru, owners, keep = self._lrus[slot], self._owners, ~(1 << slot)
        for h in hashes:
            if lru.pop(h, 0) is None:  # held: its value is None
                mask = owners[h] & keep
                if mask:
                    owners[h] = mask
                else:
                    del owners[h]

    def _evict(self, slot: int) -> None:
        lru, cap, owners = self._lrus[slot], self._caps[slot], self._owners
        keep = ~(1 << slot)
        while len(lru) > cap:
            h, _ = lru.popitem(last=False)
            mask = owners[h] & keep
            if mask:
                owners[h] = mask
            else:
                del owners[h]

    def forget(self, backend_id: str) -> None:
        """Drop everything recorded for the backend (removed, or its engine restarted)."""
        slot = self._slots.get(backend_id)
        if slot is None:
            return
        cap = self._caps[slot]
        self._caps[slot] = 0
        self._evict(slot)
        self._caps[slot] = cap


def entries_for(memory_mb: float) -> int:
    """How many (hash, backend) pairs fit in `memory_mb` megabytes."""
    return max(1, int(memory_mb * 1_000_000 // ENTRY_BYTES))
