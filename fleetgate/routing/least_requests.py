"""`least_requests`: the candidate with the fewest in-flight requests for its weight."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.load_board import BackendLoad
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.heap import IndexedHeap, Key
from fleetgate.routing.load import CandidateLoads


class LeastRequests:
    """Picks argmin (in_flight + 1) / weight, in_flight from the pool's load board.

    An indexed heap over the candidates keeps the pick O(1) and each load change O(log n);
    it is rebuilt (O(n)) only when the candidate set changes. Ties go to the backend whose load
    changed longest ago, so equal backends take turns instead of one taking every request.
    """

    name = "least_requests"

    def __init__(self, rng: random.Random, loads: CandidateLoads) -> None:
        self._loads = loads
        self._order = itertools.count()
        self._stamp: dict[BackendState, int] = {}
        # Each member's load board record, looked up once per candidate set (kept current).
        self._records: dict[BackendState, BackendLoad] = {}
        self._heap: IndexedHeap[BackendState] | None = None
        self._members: Sequence[BackendState] | None = None
        self._rng = rng

    def _key(self, state: BackendState) -> Key:
        return ((self._records[state].in_flight + 1) / state.weight, self._stamp.get(state, 0))

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        scores: Sequence[float] | None,
        now: float,
    ) -> BackendState:
        if candidates is not self._members:
            shuffled = list(candidates)
            self._rng.shuffle(shuffled)  # random order among equals after a rebuild
            self._records = dict(self._loads.of(candidates))
            for state in shuffled:
                self._stamp[state] = next(self._order)
            self._heap = IndexedHeap(shuffled, self._key)
            self._members = candidates
        assert self._heap is not None
        return self._heap.top()

    def load_changed(self, state: BackendState) -> None:
        if self._heap is not None and state in self._heap:
            self._stamp[state] = next(self._order)
            self._heap.update(state)
