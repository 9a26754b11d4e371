"""`prefix_cache` scorer: prefers the backend that most likely holds the prompt's prefix in its
KV cache, so the engine skips that part of the prefill.

    m_i     = leading prompt bytes backend i holds, by the pool's prefix index (a PrefixIndex,
              routing/stores.py; in this process routing/prefix_index.py): whole blocks
    score_i = m_i / the prompt's bytes in whole blocks       (0 for a prompt under one block)
Load guard: with q_i the backend's queue (routing/load.py) and q_min the least among the
candidates, a backend with q_i > balance_rel * q_min + balance_abs scores 0: a cached prefix is
not worth waiting behind that queue. The request then goes where the other scorers send it,
that backend is recorded as holding the prefix too, and a hot prefix spreads over as many
replicas as its load needs instead of piling onto one.

With engines that publish KV-cache events (kv_events/), a backend whose engine has reported
scores by what it says it holds instead, relative to the deepest holder:
    t_i     = leading prompt tokens in its engine's blocks (kv_events/index.py)
    score_i = t_i / max_j t_j        over the reporting candidates
The deepest holder scores 1 however little of the prompt it still holds: under cache pressure
an engine evicts a prefix tail first, and the prompt is best sent back to what is left of it,
where the tail is computed again, not spread by load to a backend that holds none (scored by
the share of the whole prompt instead, a holder of half of it lost that pull, and the fleet's
hit rate fell 5-13% below the decision-based index's; benchmarks/kv_routing.py). The others
keep their depth's proportion to it, so a conversation's follow-up still goes where its
whole history is rather than where only its system prompt is. The decision-based index stays
the answer for backends that do not report, for prompts the gateway cannot tokenize, and when
the engines' word tells no candidate apart (none holds any of the prompt, evicted everywhere
under cache pressure, or each holds the same preamble): sending it where it went before keeps
each prefix one home, which is what keeps it cached.

Every pick is recorded in the index (`chosen`), and each backend's share of the index follows
its engine's reported KV capacity. O(prompt blocks + candidates) per pick. The index knows
backends by id; so do the backends this scorer nominates for a large pool's shortlist.

Blocks start `block_bytes` long and lengthen along the prompt (routing/prefix_index.py). The
base length grows in a large pool: each backend's share of the index (max entries / backends,
in blocks of the base length) must cover its engine's KV cache, so the base doubles until the
largest reported cache fits in a share, up to 2 KB (512 tokens). With 64 MB and 8 backends of
430k tokens that is the 128 bytes given; with 252 backends of 470k tokens, 2 KB (a
12,000-token prompt weighs 24 blocks, not 375: with 128-byte blocks each backend's share would
hold about one such prompt, and recording one would evict as much as it adds). Prefixes then
match in whole larger blocks. The index keeps what was recorded under the old size until its
LRU lets it go; it matches nothing new.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import BYTES_PER_TOKEN, RoutingRequest
from fleetgate.routing.load import STALE_AFTER_S, CandidateLoads, queue_lengths
from fleetgate.routing.prefix_index import REACH, MemoryPrefixIndex, block_hashes, entries_for
from fleetgate.routing.prompt_tokens import prompt_token_ids
from fleetgate.routing.stores import EngineBlocks, PrefixIndex
from fleetgate.settings import Settings, at_least, positive

# Blocks grow no longer than this (512 tokens) however large the pool: a longer first block
# would hide the system prompts prompts share (Mooncake's share their first 512 tokens; with 4
# KB blocks a 1,000-replica pool's hit rate fell below round robin's). Past it, a large pool's
# index covers less than its engines' caches: `memory_mb` buys the rest.
MAX_BLOCK_BYTES = 2048


class PrefixCacheParams(Settings, frozen=True):
    """The `prefix_cache` scorer's parameters."""

    memory_mb: float = 64.0  # the prefix index's memory bound, shared by the pool's backends
    block_bytes: int = 128  # prompt bytes hashed per block: a prefix matches in whole blocks
    balance_abs: float = 32.0  # load guard: a backend whose queue exceeds
    balance_rel: float = 1.5  # ... balance_rel * the shortest + balance_abs scores 0
    max_nominees: int = 4  # holders of the deepest prefix put into a large pool's shortlist

    def __post_init__(self) -> None:
        positive("memory_mb", self.memory_mb)
        at_least("block_bytes", self.block_bytes, 16)
        at_least("balance_abs", self.balance_abs, 0)
        at_least("balance_rel", self.balance_rel, 1)


class PrefixCacheScorer:
    name = "prefix_cache"

    def __init__(
        self,
        loads: CandidateLoads,
        params: PrefixCacheParams = PrefixCacheParams(),
        *,
        index: PrefixIndex | None = None,
        engine_blocks: EngineBlocks | None = None,
        stale_after_s: float = STALE_AFTER_S,
    ) -> None:
        """`index`: the pool's (routing/registry.py makes it from the PluginContext's factory,
        sized by `memory_mb`); None: one of its own in this process. `engine_blocks`: what
        the pool's engines report holding, when some publish KV-cache events."""
        self._loads = loads
        self._max_entries = entries_for(params.memory_mb)
        self.index = MemoryPrefixIndex(self._max_entries) if index is None else index
        self._least_block_bytes = params.block_bytes
        self.block_bytes = params.block_bytes  # now: grown in a large pool (module docstring)
        self._balance_abs = params.balance_abs
        self._balance_rel = params.balance_rel
        self._max_nominees = params.max_nominees
        self._stale_after_s = stale_after_s
        self._engine_blocks = engine_blocks
        self._tokens_of: RoutingRequest | None = None  # the request `_tokens` belong to
        self._tokens: list[int] | None = None
        self._capacity: dict[str, float] = {}  # engine capacities applied so far, by id
        self._request: RoutingRequest | None = None  # the request `_hashes` belong to
        self._hashes: list[int] = []
        self._ids_of: Sequence[BackendState] | None = None  # the candidates `_ids` are of
        self._ids: list[str] = []

    def _hashes_of(self, request: RoutingRequest) -> list[int]:
        if request is not self._request:
            self._request = request
            self._hashes = block_hashes(request.prompt, self.block_bytes)
        return self._hashes

    def _ids_in(self, candidates: Sequence[BackendState]) -> list[str]:
        """The candidates' ids, as the index knows them: made again only for a new candidate
        set (a pool's own tuple lasts until its health changes)."""
        if candidates is not self._ids_of:
            self._ids_of = candidates
            self._ids = [state.backend.id for state in candidates]
        return self._ids

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        self._follow_capacities(candidates)
        ids = self._ids_in(candidates)
        shares = self._shares(request, ids, now)
        if shares is None:
            return [0.0] * len(candidates)
        queues = queue_lengths(self._loads.of(candidates), now, self._stale_after_s)
        limit = min(queues) * self._balance_rel + self._balance_abs
        return [share if q <= limit else 0.0 for share, q in zip(shares, queues, strict=True)]

    def _shares(self, request: RoutingRequest, ids: list[str], now: float) -> list[float] | None:
        """Each candidate's score before the load guard (module docstring); None when no
        candidate holds any of the prompt."""
        hashes = self._hashes_of(request)
        matches = self.index.matches(hashes, ids)
        whole = REACH[len(hashes)] or 1
        engine = self._engine_blocks
        if engine is None:
            if not matches:
                return None
            return [REACH[matches.get(backend, 0)] / whole for backend in ids]
        followed = {backend for backend in ids if engine.follows(backend)}
        tokens = self._token_ids(request) if followed else None
        if tokens is None:
            followed = set()
        held = engine.matches(tokens, list(followed), now) if tokens else {}
        depths = {held.get(backend, 0) for backend in followed}
        if not held or (len(followed) > 1 and len(depths) == 1):
            # The engines' word tells none of them apart (none holds any of it, or each the
            # same preamble): where it was sent before keeps it one home.
            followed = set()
        if not matches and not held:
            return None
        deepest = max((held.get(backend, 0) for backend in followed), default=0) or 1
        return [
            held.get(backend, 0) / deepest
            if backend in followed
            else REACH[matches.get(backend, 0)] / whole
            for backend in ids
        ]

    def _token_ids(self, request: RoutingRequest) -> list[int] | None:
        if request is not self._tokens_of:
            self._tokens_of = request
            self._tokens = prompt_token_ids(request)
        return self._tokens

    def nominate(self, request: RoutingRequest, now: float) -> list[str]:
        """The backends holding the deepest prefix: by their engines' word first, when some
        report, then by the decision-based index."""
        limit = self._max_nominees
        found = self.index.deepest(self._hashes_of(request), limit)
        engine = self._engine_blocks
        tokens = None if engine is None else self._token_ids(request)
        if engine is None or not tokens:
            return found
        held = engine.deepest(tokens, limit, now)
        return [*held, *(b for b in found if b not in held)][:limit]

    def chosen(self, request: RoutingRequest, state: BackendState, now: float) -> None:
        hashes = self._hashes_of(request)
        if hashes:
            self.index.record(state.backend.id, hashes)
        engine = self._engine_blocks
        if engine is not None and engine.follows(state.backend.id):
            tokens = self._token_ids(request)
            if tokens:
                engine.expect(state.backend.id, tokens, now)

    def _follow_capacities(self, candidates: Sequence[BackendState]) -> None:
        changed = []
        for state in candidates:
            engine = state.engine
            if engine is None or engine.kv_capacity_tokens is None:
                continue
            tokens = engine.kv_capacity_tokens
            backend = state.backend.id
            if self._capacity.get(backend) != tokens:
                self._capacity[backend] = tokens
                changed.append(backend)
        if not changed:
            return
        share = max(1, self._max_entries // len(self._capacity))
        block = self._least_block_bytes
        cache_bytes = max(self._capacity.values()) * BYTES_PER_TOKEN
        while block < MAX_BLOCK_BYTES and cache_bytes > share * block:
            block *= 2
        if block != self.block_bytes:  # every backend's share is counted in the new blocks
            self.block_bytes, self._request, changed = block, None, list(self._capacity)
        for backend in changed:
            blocks = int(self._capacity[backend] * BYTES_PER_TOKEN // block)
            self.index.set_capacity(backend, blocks)
