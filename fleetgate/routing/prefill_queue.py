"""`prefill_queue` scorer: prefers the backend with the fewest prompt tokens still waiting for
their prefill, so a short prompt does not queue behind long ones (head-of-line blocking is what
lengthens time to first token when prompt lengths are mixed).

    p_i     = prompt tokens sent to backend i whose first token has not come back (the
              gateway's own count on the pool's load board, fleet/load_board.py: always
              current, no scrape needed),
              divided by its effective weight w_i (typed, or calibrated), since a backend of
              weight 2.5 works through its prefill queue that much faster
    score_i = 1 - p_i / max_j p_j          (every score is 1 when no prefill is pending)
O(n) over the candidates it is given.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import CandidateLoads


class PrefillQueue:
    name = "prefill_queue"

    def __init__(self, loads: CandidateLoads) -> None:
        self._loads = loads

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        pending = [load.pending_prefill / s.weight for s, load in self._loads.of(candidates)]
        top = max(pending)
        if top <= 0:
            return [1.0] * len(pending)
        return [1.0 - p / top for p in pending]
