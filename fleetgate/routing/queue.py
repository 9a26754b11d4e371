"""`queue` scorer: prefers the backend with the fewest requests queued or running for its weight.

    q_i     = max(in-flight by the gateway (its load board), running + waiting by the engine)
              (routing/load.py)
    r_i     = q_i / w_i     w_i: the backend's effective weight (typed, or calibrated)
    score_i = 1 - r_i / max_j r_j             (every score is 1 when all queues are empty)
With equal weights it evens out requests in flight; a backend of weight 2.5 (an H100 beside
A100s) is given 2.5 times the requests in flight of a weight-1 one before it scores lower,
since it serves each of them that much faster. O(n) over the candidates it is given.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import STALE_AFTER_S, CandidateLoads, queue_lengths


class QueueScorer:
    name = "queue"

    def __init__(self, loads: CandidateLoads, stale_after_s: float = STALE_AFTER_S) -> None:
        self._loads = loads
        self._stale_after_s = stale_after_s

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        queues = queue_lengths(self._loads.of(candidates), now, self._stale_after_s)
        loads = [q / s.weight for q, s in zip(queues, candidates, strict=True)]
        top = max(loads) or 1.0
        return [1.0 - x / top for x in loads]
