"""`round_robin`: each candidate in turn."""

from __future__ import annotations

import random
from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest


class RoundRobin:
    """Picks candidates[i mod n] for i = 0, 1, 2, ...; O(1).

    The first index is random so that several gateways do not all start on the same backend.
    """

    name = "round_robin"

    def __init__(self, rng: random.Random) -> None:
        self._next = rng.randrange(1 << 16)

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        scores: Sequence[float] | None,
        now: float,
    ) -> BackendState:
        i = self._next
        self._next = i + 1
        return candidates[i % len(candidates)]
