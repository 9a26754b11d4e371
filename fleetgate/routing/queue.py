"""`queue` scorer: prefers the backend with the fewest requests queued or running.

    q_i     = max(in-flight by the gateway, running + waiting by the engine)   (routing/load.py)
    score_i = 1 - q_i / max_j q_j             (every score is 1 when all queues are empty)
O(n) over the candidates it is given.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import STALE_AFTER_S, queue_lengths


class QueueScorer:
    name = "queue"

    def __init__(self, stale_after_s: float = STALE_AFTER_S) -> None:
        self._stale_after_s = stale_after_s

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        queues = queue_lengths(candidates, now, self._stale_after_s)
        top = max(queues) or 1.0
        return [1.0 - q / top for q in queues]
