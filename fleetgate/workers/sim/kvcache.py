"""Paged KV-cache blocks with reference counts and an LRU prefix cache, as in vLLM V1.

A sequence holds a table of blocks, one per `block_size` tokens. A full prompt block is
registered under its chained hash (see prompt.py) so that a later sequence with the same prefix
reuses it (reference count + 1) instead of recomputing it. When the last holder frees a hashed
block it stays findable in an LRU of free blocks; it is evicted (its hash forgotten) only when a
block is needed and no never-used or unhashed free block remains. Freed sequences release their
blocks tail first, so a prefix's tail is evicted before its head.

Every operation costs O(1) per block touched: free hashed blocks live in an OrderedDict used as
the LRU, unhashed ones on a stack.

A `BlockEvents` listener, when given, hears what vLLM's KV events report: blocks registered
(with their tokens, when the caller gave them), blocks evicted, and the cache reset.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Protocol

Pieces = Sequence[str] | Sequence[int]
"""A prompt's tokens: the pieces of the project's token rule, or token ids."""


class BlockEvents(Protocol):
    """Hears the cache change, as an engine's KV-event publisher does."""

    def stored(self, hashes: Sequence[int], parent: int | None, pieces: Pieces) -> None:
        """Blocks are cached, each chained on the one before (`parent` before the first);
        `pieces`: their tokens, block_size each, or empty when the caller gave none."""

    def removed(self, block_hash: int) -> None:
        """A cached block was evicted."""

    def cleared(self) -> None:
        """Every cached block was forgotten."""


class _BlockTable:
    """The blocks one sequence holds, and how many of them are registered in the cache."""

    __slots__ = ("blocks", "hashes", "num_hashed", "pieces")

    def __init__(
        self, blocks: list[int], hashes: Sequence[int], num_hashed: int, pieces: Pieces
    ) -> None:
        self.blocks = blocks
        self.hashes = hashes
        self.num_hashed = num_hashed
        self.pieces = pieces


class BlockManager:
    """Allocates KV blocks to sequences and keeps freed full blocks findable by hash.

    API (sequence ids are any hashable, block hashes as made by prompt.py):
      match_prefix(hashes, max_blocks) -> leading blocks cached; changes nothing.
      allocate(seq, hashes, num_tokens, num_cached_blocks, query_tokens) -> bool: the first
        block table for a sequence, reusing its first `num_cached_blocks` cached blocks.
      append_slots(seq, num_tokens) -> bool: grow the table to cover `num_tokens` tokens.
      free(seq): drop the sequence's table.
      reset_prefix_cache() -> bool: forget all hashes, when no sequence holds blocks.
      receive(hashes) -> int: blocks another engine computed arrive (a KV transfer).
    allocate and append_slots change nothing and return False when too few blocks are free.
    """

    def __init__(self, num_blocks: int, block_size: int, events: BlockEvents | None = None) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._events = events
        self._ref = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block id, in use or free
        # Free blocks that hold a cached hash, least recently freed first (eviction order).
        self._evictable: OrderedDict[int, None] = OrderedDict()
        # Free blocks with no hash; used before any cached block is evicted.
        self._fresh: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[Hashable, _BlockTable] = {}
        self.prefix_queries_tokens = 0
        """Tokens of admitted sequences looked up in the prefix cache (vLLM counts tokens)."""
        self.prefix_hits_tokens = 0
        """Of those, tokens found cached."""

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds, cached ones included (they can be evicted)."""
        return len(self._fresh) + len(self._evictable)

    @property
    def usage(self) -> float:
        """Share of blocks held by sequences, 0..1 (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks findable by hash, held or free."""
        return len(self._cached)

    def ref_count(self, block_id: int) -> int:
        """How many sequences hold `block_id`."""
        return self._ref[block_id]

    def block_ids(self, seq_id: Hashable) -> tuple[int, ...]:
        """The block table of `seq_id`, first block first."""
        return tuple(self._tables[seq_id].blocks)

    def match_prefix(self, block_hashes: Sequence[int], max_blocks: int | None = None) -> int:
        """How many leading blocks of `block_hashes` (at most `max_blocks`) are cached.

        Hashes are chained, so a hit on block i implies the whole prefix up to i matches.
        """
        limit = len(block_hashes) if max_blocks is None else min(max_blocks, len(block_hashes))
        cached = self._cached
        for i in range(limit):
            if block_hashes[i] not in cached:
                return i
        return limit

    def allocate(
        self,
        seq_id: Hashable,
        block_hashes: Sequence[int],
        num_tokens: int,
        num_cached_blocks: int,
        query_tokens: int,
        *,
        pieces: Pieces = (),
    ) -> bool:
        """Give `seq_id` blocks for its first `num_tokens` tokens; False (no change) if short.

        The first `num_cached_blocks` blocks are the cached ones `match_prefix` found (shared,
        reference count + 1); the rest are taken from the free pool. Full blocks among the new
        ones are registered under their hash as their tokens are computed (`pieces`: the
        prompt's tokens, for the listener). `query_tokens` and the reused tokens feed the
        prefix-cache counters.
        """
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already holds blocks")
        bs = self.block_size
        needed = -(-num_tokens // bs)
        if num_cached_blocks > needed or num_cached_blocks > len(block_hashes):
            raise ValueError("num_cached_blocks exceeds the blocks asked for")
        cached = self._cached
        ref = self._ref
        hits = [cached[block_hashes[i]] for i in range(num_cached_blocks)]
        reused_free = sum(1 for b in hits if ref[b] == 0)
        if needed - num_cached_blocks + reused_free > self.num_free_blocks:
            return False
        for b in hits:
            if ref[b] == 0:
                del self._evictable[b]
            ref[b] += 1
        for _ in range(needed - num_cached_blocks):
            hits.append(self._take())
        table = _BlockTable(hits, block_hashes, num_cached_blocks, pieces)
        self._tables[seq_id] = table
        self._register(table, num_tokens)
        self.prefix_queries_tokens += query_tokens
        self.prefix_hits_tokens += num_cached_blocks * bs
        return True

    def append_slots(self, seq_id: Hashable, num_tokens: int) -> bool:
        """Grow `seq_id`'s table to cover `num_tokens` tokens; False (no change) if short."""
        table = self._tables[seq_id]
        blocks = table.blocks
        missing = -(-num_tokens // self.block_size) - len(blocks)
        if missing > 0:
            if missing > self.num_free_blocks:
                return False
            for _ in range(missing):
                blocks.append(self._take())
        self._register(table, num_tokens)
        return True

    def free(self, seq_id: Hashable) -> None:
        """Release `seq_id`'s blocks, tail first; hashed ones stay cached until evicted."""
        table = self._tables.pop(seq_id)
        ref = self._ref
        hash_of = self._hash_of
        for b in reversed(table.blocks):
            ref[b] -= 1
            if ref[b] == 0:
                if hash_of[b] is None:
                    self._fresh.append(b)
                else:
                    self._evictable[b] = None

    def receive(self, block_hashes: Sequence[int], pieces: Pieces = ()) -> int:
        """Blocks computed by another engine arrive, as in prefill/decode disaggregation: each
        one not cached yet takes a free block and is cached under its hash, as if computed here
        and freed, so the sequence they are for finds them with `match_prefix`. Stops before
        evicting a block received in this call; returns how many leading blocks are cached."""
        cached, ref, evictable = self._cached, self._ref, self._evictable
        received: set[int] = set()
        new: list[int] = []  # indexes of the blocks cached by this call
        for i, h in enumerate(block_hashes):
            b = cached.get(h)
            if b is not None:
                if ref[b] == 0:
                    evictable.move_to_end(b)
                continue
            if not self._fresh and (not evictable or next(iter(evictable)) in received):
                self._tell_stored(block_hashes, new, pieces)
                return i
            b = self._take()
            ref[b] = 0
            self._hash_of[b] = h
            cached[h] = b
            evictable[b] = None
            received.add(b)
            new.append(i)
        self._tell_stored(block_hashes, new, pieces)
        return len(block_hashes)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only when no sequence holds blocks (False otherwise)."""
        if self._tables:
            return False
        self._cached.clear()
        self._evictable.clear()
        self._hash_of = [None] * self.num_blocks
        self._fresh = list(range(self.num_blocks - 1, -1, -1))
        if self._events is not None:
            self._events.cleared()
        return True

    def _take(self) -> int:
        """A free block for new tokens: a never-used one, else evict the least recently freed."""
        if self._fresh:
            b = self._fresh.pop()
        else:
            b, _ = self._evictable.popitem(last=False)
            h = self._hash_of[b]
            assert h is not None
            del self._cached[h]
            self._hash_of[b] = None
            if self._events is not None:
                self._events.removed(h)
        self._ref[b] = 1
        return b

    def _register(self, table: _BlockTable, num_tokens: int) -> None:
        """Make the table's newly full blocks findable under their hash."""
        full = min(num_tokens // self.block_size, len(table.hashes))
        if full <= table.num_hashed:
            return
        cached = self._cached
        new: list[int] = []
        for i in range(table.num_hashed, full):
            h = table.hashes[i]
            # A block with the same content may already be cached (two identical prompts
            # prefilled at once); the later copy stays unhashed and is recycled first.
            if h not in cached:
                b = table.blocks[i]
                cached[h] = b
                self._hash_of[b] = h
                new.append(i)
        table.num_hashed = full
        if new:
            self._tell_stored(table.hashes, new, table.pieces)

    def _tell_stored(self, hashes: Sequence[int], new: list[int], pieces: Pieces) -> None:
        """Tell the listener that blocks `new` (indexes into `hashes`, ascending) are cached:
        one event per run of consecutive blocks, as each run chains on the block before it."""
        events = self._events
        if events is None or not new:
            return
        bs = self.block_size
        start = 0
        for k in range(1, len(new) + 1):
            if k == len(new) or new[k] != new[k - 1] + 1:
                first, end = new[start], new[k - 1] + 1
                parent = hashes[first - 1] if first else None
                tokens = pieces[first * bs : end * bs] if len(pieces) >= end * bs else ()
                events.stored(hashes[first:end], parent, tokens)
                start = k
