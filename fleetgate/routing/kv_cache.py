"""`kv_cache` scorer: prefers the backend whose engine has the most free KV cache.

    score_i = 1 - k_i       k_i: the engine's last fresh KV-cache use in [0, 1]
A backend without a fresh reading gets the mean of the known readings (1 - mean), so it is
neither favoured nor punished for a missing scrape; with no readings at all every score is 1.
O(n) over the candidates it is given.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import STALE_AFTER_S, kv_usages


class KvCacheScorer:
    name = "kv_cache"

    def __init__(self, stale_after_s: float = STALE_AFTER_S) -> None:
        self._stale_after_s = stale_after_s

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        kvs = kv_usages(candidates, now, self._stale_after_s)
        if None not in kvs:
            return [1.0 - k for k in kvs]  # type: ignore[operator]
        known = [k for k in kvs if k is not None]
        mean = sum(known) / len(known) if known else 0.0
        return [1.0 - (mean if k is None else k) for k in kvs]
