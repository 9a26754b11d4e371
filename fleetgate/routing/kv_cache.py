"""`kv_cache` scorer: prefers the backend whose engine has the most free KV cache.

    score_i = 1 - k_i / max_j k_j       (every score is 1 when every cache is empty)
k_i: the backend's KV-cache use now, its engine's last fresh reading updated with the prompts
the gateway sent and finished since (routing/load.py). Relative, as the queue scorer is, so
that caches a fifth full are still told apart. A backend without a fresh reading gets the mean
of the known ones, so it is neither favoured nor punished for a missing scrape; with no
readings at all every score is 1.
O(n) over the candidates it is given.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import STALE_AFTER_S, CandidateLoads, kv_usages


class KvCacheScorer:
    name = "kv_cache"

    def __init__(self, loads: CandidateLoads, stale_after_s: float = STALE_AFTER_S) -> None:
        self._loads = loads
        self._stale_after_s = stale_after_s

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        kvs = kv_usages(self._loads.of(candidates), now, self._stale_after_s)
        known = [k for k in kvs if k is not None]
        top = max(known, default=0.0)
        if top <= 0.0:
            return [1.0] * len(kvs)
        mean = sum(known) / len(known)
        return [1.0 - (mean if k is None else k) / top for k in kvs]
