"""`weighted_round_robin`: smooth weighted round robin."""

from __future__ import annotations

import random
from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.heap import IndexedHeap, Key

_GOLDEN = 0.6180339887498949


class WeightedRoundRobin:
    """Each backend gets picks in proportion to its weight, spread out rather than in bursts.

    Earliest-deadline-first, as Envoy schedules weighted hosts: backend i is due at
    d_i = (k + phase_i) / w_i for its k-th pick; the pick is the earliest due backend, O(log n).
    phase_i = frac((i + 1) * golden ratio) gives backends of equal weight distinct deadlines,
    so they interleave with the heavy ones instead of arriving together.
    Like nginx's smooth weighted round robin, over any full cycle of sum(w) picks (integer
    weights) each backend gets exactly w_b, and picks of one backend are evenly spaced: weights
    5, 1, 1 never give the heavy backend more than three picks in a row.
    """

    name = "weighted_round_robin"

    def __init__(self, rng: random.Random) -> None:
        self._due: dict[BackendState, float] = {}
        self._seq: dict[BackendState, int] = {}
        self._heap: IndexedHeap[BackendState] | None = None
        self._members: Sequence[BackendState] | None = None

    def _key(self, state: BackendState) -> Key:
        return (self._due[state], self._seq[state])

    def _rebuild(self, candidates: Sequence[BackendState]) -> None:
        self._due = {s: ((i + 1) * _GOLDEN % 1.0) / s.weight for i, s in enumerate(candidates)}
        self._seq = {s: i for i, s in enumerate(candidates)}
        self._heap = IndexedHeap(candidates, self._key)
        self._members = candidates

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        scores: Sequence[float] | None,
        now: float,
    ) -> BackendState:
        if candidates is not self._members or self._heap is None:
            self._rebuild(candidates)
        assert self._heap is not None
        chosen = self._heap.top()
        self._due[chosen] += 1.0 / chosen.weight
        self._heap.update(chosen)
        return chosen
