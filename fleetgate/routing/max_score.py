"""`max_score`: the picker of scored profiles; the best combined score wins."""

from __future__ import annotations

import random
from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest


class MaxScore:
    """Picks argmax of the combined scores; ties (within 1e-9) are broken at random, so equal
    backends share the traffic instead of the first one taking it all. O(n)."""

    name = "max_score"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        scores: Sequence[float] | None,
        now: float,
    ) -> BackendState:
        if not scores:
            return candidates[self._rng.randrange(len(candidates))]
        best = max(scores)
        top = [i for i, s in enumerate(scores) if s >= best - 1e-9]
        return candidates[top[0] if len(top) == 1 else top[self._rng.randrange(len(top))]]
