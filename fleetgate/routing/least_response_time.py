"""`least_response_time` scorer: prefers the backend predicted to finish this request soonest.

For a request of P prompt tokens (estimated, routing/base.py) and N output tokens (`max_tokens`,
else the backend's recent mean answer length), on backend i:
    T_i = prefill_i * (pending_i + P)  +  tpot_i * N * (1 + q_i)
    prefill_i  recent seconds to first token per prompt token it had to prefill   (fleet/latency.py)
    pending_i  prompt tokens already sent to it whose first token has not come back: the
               prefill queue this request joins (the gateway's own count on the pool's load
               board, always current)
    tpot_i     recent seconds per output token
    q_i        requests there now: max(gateway's in flight, engine's running + waiting)
The decode term grows with the queue the request joins, so a backend that was fast a moment
ago does not draw every request at once. (Scaling it by the queue relative to the one the
speed was measured under instead let busy backends look as good as idle ones: it herded.)
A speed a backend has not measured yet takes the best among the candidates that have, so a
new backend is tried rather than avoided.
    score_i = min_j T_j / T_i          (1 for the soonest; all 1 while nothing is known)
O(n) over the candidates it is given.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import STALE_AFTER_S, CandidateLoads, queue_lengths

DEFAULT_OUTPUT_TOKENS = 256.0  # answer length assumed before any answer was measured


class LeastResponseTime:
    name = "least_response_time"

    def __init__(self, loads: CandidateLoads, stale_after_s: float = STALE_AFTER_S) -> None:
        self._loads = loads
        self._stale_after_s = stale_after_s

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        prefill = best_known([s.latency.prefill_s_per_token for s in candidates])
        tpot = best_known([s.latency.tpot_s for s in candidates])
        loaded = self._loads.of(candidates)
        queues = queue_lengths(loaded, now, self._stale_after_s)
        prompt = request.prompt_tokens
        times: list[float] = []
        for i, (state, load) in enumerate(loaded):
            lat = state.latency
            out = request.max_tokens or lat.output_tokens or DEFAULT_OUTPUT_TOKENS
            decode = tpot[i] * out * (1.0 + queues[i])
            times.append(prefill[i] * (load.pending_prefill + prompt) + decode)
        best = min(times)
        if best <= 0.0:
            return [1.0 if t <= 0.0 else 0.0 for t in times]
        return [best / t for t in times]


def best_known(values: list[float | None]) -> list[float]:
    """Each value, or the least known one where it is missing (0 if none is known)."""
    known = [v for v in values if v is not None]
    fill = min(known) if known else 0.0
    return [fill if v is None else v for v in values]
