"""Which blocks each engine holds, as its KV-cache events tell (kv_events/feeds.py).

An engine names a block by a hash of its own (salted, or sha256 of pickled tokens), which a
gateway cannot compute from a prompt. So each stored block is keyed here by a hash of its
tokens, chained on the block before it, as routing/prefix_index.py chains bytes:
    k_0 = xxh3_64(ids of block 0),   k_i = xxh3_64(ids of block i, seed = k_(i-1))
with the engine's hash of each block mapped to its key, per backend, so that a removal (which
names only the engine's hash) finds it, and a stored block's parent (the engine's hash) gives
its chain's seed. A prompt's keys are the same chain over its own token ids
(routing/prompt_tokens.py), cut at the engine's block size.

An engine reports a prompt's blocks once it has computed them, a step or a queue after the
gateway sent it; a second request with the same prefix sent meanwhile would find nothing. So
the scorer also tells the index where it sends each prompt (`expect`): those blocks count as
held by that backend until its engine reports them or `PENDING_S` passes, whichever is first
(once reported, they are the engine's word alone: under cache pressure it may evict them
within the second).
Gateways sharing Redis tell each other what they sent (shared/engine_blocks.py: `hold`).

Blocks stored for a LoRA adapter or in an offload tier (medium other than GPU) are not
indexed: a base-model prompt cannot use the first, and the second is slower than the load
guard assumes. A stored event whose parent this index does not hold (it heard the stream from
its middle) is skipped and counted in `orphans`. The keys per backend live in a
MemoryPrefixIndex, so memory is bounded the same way (`max_entries` keys in all), and so is
each backend's map of engine hashes (its oldest go first): an engine that reports storing
more than it could hold, or never reports evicting, costs no more.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable, Sequence
from itertools import count

from xxhash import xxh3_64_intdigest

from fleetgate.kv_events.wire import BlockHash, Cleared, Event, Removed, Stored
from fleetgate.routing.prefix_index import MemoryPrefixIndex

PENDING_S = 2.0  # how long a prompt sent counts as held before its engine reports it
PENDING_ENTRIES = 100_000  # (key, backend) pairs expected at most: a bound on its memory


def token_keys(ids: Sequence[int], block_size: int, seed: int = 0) -> list[int]:
    """The chained keys of the full blocks of `ids` (see the module docstring)."""
    keys = []
    k = seed
    for start in range(0, len(ids) - block_size + 1, block_size):
        k = xxh3_64_intdigest(array("q", ids[start : start + block_size]).tobytes(), k)
        keys.append(k)
    return keys


class EngineBlockIndex:
    """The blocks each backend's engine reports holding, by their token keys."""

    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        self._held = MemoryPrefixIndex(max_entries, lengthening=False)
        # sent, not reported yet
        self._pending = MemoryPrefixIndex(PENDING_ENTRIES, lengthening=False)
        # When each expectation lapses (a heap: another gateway's may lapse before this one's),
        # and each expected block's latest end: a block two prompts share stays expected
        # until the later one's lapses.
        self._expiring: list[tuple[float, int, str, list[int]]] = []
        self._order = count()  # ties in `_expiring` broken by arrival, never by the keys
        self._until: dict[tuple[str, int], float] = {}
        self._keys: dict[str, dict[BlockHash, int]] = {}  # backend -> engine hash -> key
        self._block_size: dict[str, int] = {}  # the backends heard from: their block size
        self._sizes: set[int] = set()  # every block size heard (engines share one, or a few)
        self.orphans = 0

    def follows(self, backend_id: str) -> bool:
        """Whether the backend's engine has told what it holds (since it last started)."""
        return backend_id in self._block_size

    def blocks(self, backend_id: str) -> int:
        """Blocks the backend's engine holds, as far as this index knows."""
        return len(self._keys.get(backend_id, ()))

    def apply(self, backend_id: str, events: Iterable[Event]) -> None:
        """One batch of the backend's events, in order."""
        for event in events:
            if isinstance(event, Stored):
                self._stored(backend_id, event)
            elif isinstance(event, Removed):
                self._removed(backend_id, event)
            elif isinstance(event, Cleared):  # followed still, holding nothing
                bs = self._block_size.get(backend_id, 0)
                self.forget(backend_id)
                self._block_size[backend_id] = bs

    def _stored(self, backend_id: str, event: Stored) -> None:
        bs = event.block_size
        if self._block_size.get(backend_id, bs) not in (0, bs):
            self.forget(backend_id)  # a new block size: the engine was started anew
        self._block_size[backend_id] = bs
        self._sizes.add(bs)
        if event.lora is not None or event.medium not in (None, "GPU"):
            return
        keys_of = self._keys.setdefault(backend_id, {})
        seed = 0
        if event.parent is not None:
            parent = keys_of.get(event.parent)
            if parent is None:
                self.orphans += 1
                return
            seed = parent
        keys = token_keys(event.token_ids, bs, seed)
        for h, k in zip(event.hashes, keys, strict=True):
            keys_of[h] = k
        while len(keys_of) > self._max_entries:
            del keys_of[next(iter(keys_of))]
        self._held.record(backend_id, keys)
        self._pending.drop(backend_id, keys)  # reported: its removal now counts at once

    def _removed(self, backend_id: str, event: Removed) -> None:
        keys_of = self._keys.get(backend_id)
        if keys_of is None:
            return
        gone = [k for k in (keys_of.pop(h, None) for h in event.hashes) if k is not None]
        self._held.drop(backend_id, gone)
        self._pending.drop(backend_id, gone)  # sent again since: evicted all the same

    def forget(self, backend_id: str) -> None:
        """Drop all the backend holds (its engine restarted, or its stream cannot be trusted);
        it is followed again from its next batch."""
        self._keys.pop(backend_id, None)
        self._block_size.pop(backend_id, None)
        self._held.forget(backend_id)
        self._pending.forget(backend_id)

    def expect(self, backend_id: str, ids: Sequence[int], now: float) -> None:
        """A prompt was sent to the backend: its blocks count as held until its engine
        reports them, or for PENDING_S (module docstring)."""
        self.hold(backend_id, self.keys_for(backend_id, ids), now + PENDING_S, now)

    def keys_for(self, backend_id: str, ids: Sequence[int]) -> list[int]:
        """The keys of `ids` at the backend's block size (none when it is not followed)."""
        bs = self._block_size.get(backend_id)
        return token_keys(ids, bs) if bs else []

    def hold(self, backend_id: str, keys: list[int], until: float, now: float) -> None:
        """Count the blocks of `keys` held by the backend until `until` (unless its engine
        says first); nothing when it is not followed. What lapsed by `now` goes first: a
        gateway that hears others' expectations but routes nothing keeps none past theirs."""
        self._expire(now)
        if not keys or backend_id not in self._block_size:
            return
        self._pending.record(backend_id, keys)
        ends = self._until
        for k in keys:
            ends[backend_id, k] = max(until, ends.get((backend_id, k), until))
        heapq.heappush(self._expiring, (until, next(self._order), backend_id, keys))

    def _expire(self, now: float) -> None:
        expiring, ends = self._expiring, self._until
        while expiring and expiring[0][0] <= now:
            _, _, backend_id, keys = heapq.heappop(expiring)
            lapsed = [k for k in keys if ends.get((backend_id, k), now + 1) <= now]
            for k in lapsed:
                del ends[backend_id, k]
            self._pending.drop(backend_id, lapsed)

    def deepest(self, ids: Sequence[int], limit: int, now: float) -> list[str]:
        """Up to `limit` of the backends holding the longest prefix of `ids` (those holding it
        first, then those expecting it): O(blocks + limit) per block size in use, whatever
        the number of backends, as a large pool's shortlist needs."""
        self._expire(now)
        found: list[str] = []
        for bs in self._sizes:
            keys = token_keys(ids, bs)
            for index in (self._held, self._pending):
                found += (b for b in index.deepest(keys, limit) if b not in found)
        return found[:limit]

    def matches(self, ids: Sequence[int], among: Sequence[str], now: float) -> dict[str, int]:
        """Per followed backend of `among` holding the prompt's first block (or expecting
        it), how many of its leading tokens it holds (whole blocks)."""
        self._expire(now)
        by_size: dict[int, list[str]] = {}
        for backend in among:
            bs = self._block_size.get(backend)
            if bs:
                by_size.setdefault(bs, []).append(backend)
        found: dict[str, int] = {}
        for bs, backends in by_size.items():
            keys = token_keys(ids, bs)
            held = self._held.matches(keys, backends)
            for backend, blocks in self._pending.matches(keys, backends).items():
                held[backend] = max(blocks, held.get(backend, 0))
            for backend, blocks in held.items():
                found[backend] = blocks * bs
        return found
