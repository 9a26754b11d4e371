"""`least_loaded` scorer: prefers the backend whose engine is least busy.

For each candidate i, with the engine's last fresh reading (running r, waiting w, KV use k)
and the gateway's own in-flight count f:
    load_i  = max(f_i, r_i + w_i)        the engine's count includes other clients; the
                                          gateway's own catches requests sent since the scrape
    score_i = 0.5 * (1 - load_i / max_j load_j) + 0.5 * (1 - k_i)
Without a fresh reading, load_i = f_i and k_i is taken as the pool's mean of known readings
(0 if none), so a backend is neither favoured nor punished for a missing scrape. O(n).
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest


class LeastLoaded:
    def __init__(self, stale_after_s: float = 5.0) -> None:
        self._stale_after_s = stale_after_s

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        loads: list[float] = []
        kvs: list[float | None] = []
        for state in candidates:
            engine = state.engine.fresh(now, self._stale_after_s) if state.engine else None
            if engine is None:
                loads.append(float(state.in_flight))
                kvs.append(None)
            else:
                loads.append(max(float(state.in_flight), engine.running + engine.waiting))
                kvs.append(engine.kv_usage)
        known = [k for k in kvs if k is not None]
        mean_kv = sum(known) / len(known) if known else 0.0
        top = max(loads) or 1.0
        return [
            0.5 * (1.0 - load / top) + 0.5 * (1.0 - min(1.0, kv if kv is not None else mean_kv))
            for load, kv in zip(loads, kvs, strict=True)
        ]
