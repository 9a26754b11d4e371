"""`least_response_time` scorer: prefers the backend predicted to finish this request soonest.

For a request of P prompt tokens (estimated, routing/base.py) and N output tokens (`max_tokens`,
else the backend's recent mean answer length), on backend i:
    T_i = prefill_i * P  +  tpot_i * N  +  wait_i
    prefill_i = recent time to first token per prompt token        (fleet/latency.py)
    tpot_i    = recent time per output token
    wait_i    = waiting_i * e2e_i / max(1, running_i)
wait_i is the engine's queue (fresh readings only): a batch of r running requests lasting e2e
each frees a slot every e2e / r, so the w queued ahead start after about w * e2e / r. A term a
backend has not measured yet takes the best value among the candidates that have, so a new
backend is tried rather than avoided.
    score_i = min_j T_j / T_i          (1 for the soonest; all 1 while nothing is known)
O(n) over the candidates it is given.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import STALE_AFTER_S

DEFAULT_OUTPUT_TOKENS = 256.0  # answer length assumed before any answer was measured


class LeastResponseTime:
    name = "least_response_time"

    def __init__(self, stale_after_s: float = STALE_AFTER_S) -> None:
        self._stale_after_s = stale_after_s

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        prefill = _best_known([s.latency.prefill_s_per_token for s in candidates])
        tpot = _best_known([s.latency.tpot_s for s in candidates])
        e2e = _best_known([s.latency.e2e_s for s in candidates])
        prompt = request.prompt_tokens
        times: list[float] = []
        for i, state in enumerate(candidates):
            lat = state.latency
            out = request.max_tokens or lat.output_tokens or DEFAULT_OUTPUT_TOKENS
            t = prefill[i] * prompt + tpot[i] * out
            engine = state.engine
            if engine is not None and now - engine.scraped_at <= self._stale_after_s:
                t += engine.waiting * e2e[i] / max(1.0, engine.running)
            times.append(t)
        best = min(times)
        if best <= 0.0:
            return [1.0 if t <= 0.0 else 0.0 for t in times]
        return [best / t for t in times]


def _best_known(values: list[float | None]) -> list[float]:
    """Each value, or the least known one where it is missing (0 if none is known)."""
    known = [v for v in values if v is not None]
    fill = min(known) if known else 0.0
    return [fill if v is None else v for v in values]
