"""`power_of_two`: two random candidates, the less loaded one wins."""

from __future__ import annotations

import random
from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import CandidateLoads


class PowerOfTwo:
    """Draw two distinct candidates; pick the one with the lower (in_flight + 1) / weight,
    in_flight from the pool's load board.

    O(1). Two choices keep the maximum load within O(log log n) of the mean (Mitzenmacher)
    while never herding every request onto the single least-loaded backend.
    """

    name = "power_of_two"

    def __init__(self, rng: random.Random, loads: CandidateLoads) -> None:
        self._rng = rng
        self._loads = loads

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        scores: Sequence[float] | None,
        now: float,
    ) -> BackendState:
        n = len(candidates)
        if n == 1:
            return candidates[0]
        i = self._rng.randrange(n)
        j = self._rng.randrange(n - 1)
        if j >= i:
            j += 1
        loaded = self._loads.of(candidates)  # the pool's tuple: looked up once per health change
        (a, a_load), (b, b_load) = loaded[i], loaded[j]
        if (b_load.in_flight + 1) * a.weight < (a_load.in_flight + 1) * b.weight:
            return b
        return a
