"""How busy backends are, from each engine's last fresh reading and the gateway's own count.

The engine's count includes other clients' requests; the gateway's (its pool's load board,
fleet/load_board.py) includes requests sent since the last scrape. Routing takes the larger,
and the gateway's alone once the reading is stale. The helpers take a whole candidate list:
scorers call them once per pick, not per backend.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.load_board import BackendLoad, LoadBoard

STALE_AFTER_S = 5.0  # the default age beyond which an engine reading is not trusted
Loaded = tuple[BackendState, BackendLoad]  # a candidate and its record on the load board
MAX_PAIRS = 65_536  # candidates kept with their records (more: the map is made anew)


class CandidateLoads:
    """The load board's records of a candidate set: the plugins of a pipeline share one
    (routing/registry.py PluginContext), so a pick looks each candidate up at most once however
    many plugins read loads. A backend's record is asked of the board the first time it is a
    candidate and kept beside it as a (state, record) pair: a pool's own tuple (every pick of a
    pool no larger than the shortlist) costs nothing after its first pick, and a large pool's
    shortlist one dict lookup per candidate. Holding the records is sound because a board
    keeps each one current in place, for as long as its backend is a member (fleet/
    load_board.py; one that leaves and returns is a new state). Pairs, not a list of records
    beside the candidates: a scorer's loop over them reads as fast as the counters on the
    backend's state did, where a zip of two lists took twice as long."""

    __slots__ = ("_loaded", "_of", "_pairs", "board")

    def __init__(self, board: LoadBoard) -> None:
        self.board = board
        self._pairs: dict[BackendState, Loaded] = {}  # every candidate seen, with its record
        self._of: Sequence[BackendState] | None = None  # held, so its id is never reused
        self._loaded: list[Loaded] = []

    def of(self, candidates: Sequence[BackendState]) -> list[Loaded]:
        """Each candidate with its record, in order."""
        if candidates is not self._of:
            pairs = self._pairs
            try:
                self._loaded = [pairs[state] for state in candidates]
            except KeyError:
                self._loaded = self._first_seen(candidates)
            self._of = candidates
        return self._loaded

    def _first_seen(self, candidates: Sequence[BackendState]) -> list[Loaded]:
        """The pairs of a candidate set some of which were never candidates before."""
        pairs = self._pairs
        if len(pairs) > MAX_PAIRS:  # backends that left, never to be seen again: start over
            pairs.clear()
        new = [state for state in candidates if state not in pairs]
        records = self.board.loads([state.backend.id for state in new])
        for state, record in zip(new, records, strict=True):
            pairs[state] = (state, record)
        return [pairs[state] for state in candidates]


def queue_lengths(loaded: Sequence[Loaded], now: float, stale_after_s: float) -> list[float]:
    """Per backend: max(in flight by the gateway, running + waiting by the engine)."""
    queues: list[float] = []
    oldest = now - stale_after_s
    for state, load in loaded:
        engine = state.engine
        mine = float(load.in_flight)
        if engine is None or engine.scraped_at < oldest:
            queues.append(mine)
        else:
            theirs = engine.running + engine.waiting
            queues.append(theirs if theirs > mine else mine)
    return queues


def kv_usages(loaded: Sequence[Loaded], now: float, stale_after_s: float) -> list[float | None]:
    """Per backend: its KV-cache use now in [0, 1], or None without a fresh engine reading.

        k_i = kv_read + (t_now - t_read) / capacity
    kv_read: the engine's last reading; t: the gateway's in-flight prompt tokens to it, now and
    when it was read (so the prompts sent since count at once, and those finished since are let
    go); capacity: the engine's KV cache in tokens, when it reports it (else k_i = kv_read).
    """
    oldest = now - stale_after_s
    usages: list[float | None] = []
    for state, load in loaded:
        engine = state.engine
        if engine is None or engine.scraped_at < oldest:
            usages.append(None)
            continue
        kv = engine.kv_usage
        capacity = engine.kv_capacity_tokens
        if capacity:
            kv += (load.in_flight_tokens - engine.sent_tokens) / capacity
        usages.append(min(1.0, max(0.0, kv)))
    return usages
