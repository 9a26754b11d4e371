"""`random`: a uniformly random candidate."""

from __future__ import annotations

import random
from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest


class RandomPick:
    """Picks candidates[U(0, n)]; O(1). Ignores weights and load, by design: the baseline."""

    name = "random"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        scores: Sequence[float] | None,
        now: float,
    ) -> BackendState:
        return candidates[self._rng.randrange(len(candidates))]
