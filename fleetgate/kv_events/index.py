"""Which blocks each engine holds, as its KV-cache events tell (kv_events/feeds.py).

An engine names a block by a hash of its own (salted, or sha256 of pickled tokens), which a
gateway cannot compute from a prompt. So each stored block is keyed here by a hash of its
tokens, chained on the block before it, as routing/prefix_index.py chains bytes:
    k_0 = xxh3_64(ids of block 0),   k_i = xxh3_64(ids of block i, seed = k_(i-1))
with the engine's hash of each block mapped to its key, per backend, so that a removal (which
names only the engine's hash) finds it, and a stored block's parent (the engine's hash) gives
its chain's seed. A prompt's keys are the same chain over its own token ids
(routing/prompt_tokens.py), cut at the engine's block size.

Blocks stored for a LoRA adapter or in an offload tier (medium other than GPU) are not
indexed: a base-model prompt cannot use the first, and the second is slower than the load
guard assumes. A stored event whose parent this index does not hold (it heard the stream from
its middle) is skipped and counted in `orphans`. The keys per backend live in a
MemoryPrefixIndex, so memory is bounded the same way (`max_entries` keys in all), and so is
each backend's map of engine hashes (its oldest go first): an engine that reports storing
more than it could hold, or never reports evicting, costs no more.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

from xxhash import xxh3_64_intdigest

from fleetgate.kv_events.wire import BlockHash, Cleared, Event, Removed, Stored
from fleetgate.routing.prefix_index import MemoryPrefixIndex


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
        self._held = MemoryPrefixIndex(max_entries)
        self._keys: dict[str, dict[BlockHash, int]] = {}  # backend -> engine hash -> key
        self._block_size: dict[str, int] = {}  # the backends heard from: their block size
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
            elif isinstance(event, Cleared):
                self.forget(backend_id)
                self._block_size[backend_id] = 0

    def _stored(self, backend_id: str, event: Stored) -> None:
        bs = event.block_size
        if self._block_size.get(backend_id, bs) not in (0, bs):
            self.forget(backend_id)  # a new block size: the engine was started anew
        self._block_size[backend_id] = bs
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

    def _removed(self, backend_id: str, event: Removed) -> None:
        keys_of = self._keys.get(backend_id)
        if keys_of is None:
            return
        gone = [k for k in (keys_of.pop(h, None) for h in event.hashes) if k is not None]
        self._held.drop(backend_id, gone)

    def forget(self, backend_id: str) -> None:
        """Drop all the backend holds (its engine restarted, or its stream cannot be trusted);
        it is followed again from its next batch."""
        self._keys.pop(backend_id, None)
        self._block_size.pop(backend_id, None)
        self._held.forget(backend_id)

    def deepest(self, ids: Sequence[int], limit: int) -> list[str]:
        """Up to `limit` of the backends holding the longest prefix of `ids`, deepest first."""
        sizes = {bs for bs in self._block_size.values() if bs}
        ranked: list[tuple[int, str]] = []
        for bs in sizes:
            keys = token_keys(ids, bs)
            among = [b for b, size in self._block_size.items() if size == bs]
            for backend, blocks in self._held.matches(keys, among).items():
                ranked.append((blocks * bs, backend))
        ranked.sort(key=lambda pair: -pair[0])
        return [backend for _, backend in ranked[:limit]]

    def matches(self, ids: Sequence[int], among: Sequence[str]) -> dict[str, int]:
        """Per followed backend of `among` holding the prompt's first block, how many of its
        leading tokens it holds (whole blocks)."""
        by_size: dict[int, list[str]] = {}
        for backend in among:
            bs = self._block_size.get(backend)
            if bs:
                by_size.setdefault(bs, []).append(backend)
        found: dict[str, int] = {}
        for bs, backends in by_size.items():
            for backend, blocks in self._held.matches(token_keys(ids, bs), backends).items():
                found[backend] = blocks * bs
        return found
