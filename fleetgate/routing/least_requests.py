"""`least_requests`: the candidate with the fewest in-flight requests for its weight."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.heap import IndexedHeap, Key


class LeastRequests:
    """Picks argmin (in_flight + 1) / weight.

    An indexed heap over the candidates keeps the pick O(1) and each load change O(log n);
    it is rebuilt (O(n)) only when the candidate set changes. Ties go to the backend whose load
    changed longest ago, so equal backends take turns instead of one taking every request.
    """

    name = "least_requests"

    def __init__(self, rng: random.Random) -> None:
        self._order = itertools.count()
        self._stamp: dict[BackendState, int] = {}
        self._heap: IndexedHeap[BackendState] | None = None
        self._members: Sequence[BackendState] | None = None
        self._rng = rng

    def _key(self, state: BackendState) -> Key:
        return ((state.in_flight + 1) / state.weight, self._stamp.get(state, 0))

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
