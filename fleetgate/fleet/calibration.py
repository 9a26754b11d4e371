"""Self-calibrating weights: a backend's share follows its measured speed, so an H100 gets more
than an A100 without anyone typing a weight, and a backend that slows down (thermal
throttling) gets less until it recovers.

    speed_i  = 1 / tpot_i      recent seconds per output token (fleet/latency.py), trusted once
                               the backend has streamed `min_samples` answers
    factor_i = clamp(speed_i / max_j speed_j, FLOOR, 1)          (1 while unmeasured)
    weight_i = configured weight_i * factor_i * slow-start share_i           (fleet/pool.py)
Recomputed every `interval_s`. Speeds are measured under the load routing itself gives, so a
weight-aware policy settles where the backends' per-token times are close.

Off by default. On the mixed H100/A100 fleet of benchmarks/routing.py it has not beaten typed
weights: a per-token time measured under load moves with the load the weights themselves
shift. Speeds from prefill time per token (1 / fleet/latency.py's prefill_s_per_token) did no
better: from equal typed weights at 34 req/s, `balanced` reached 75% SLO attainment and a 21%
utilization spread against 85% and 12% with typed weights 2.5 / 1. A speed that does not
depend on load (e.g. a fit of engine step time against the tokens in the step) is the next
thing to try.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetgate.fleet.backend import BackendState

FLOOR = 0.1  # no backend is weighted below this share of the fastest's


@dataclass(frozen=True, slots=True)
class WeightSettings:
    enabled: bool = False  # opt-in: see the note below
    interval_s: float = 10.0  # between two recalibrations
    min_samples: int = 10  # streamed answers before a backend's speed is trusted


def speed_factors(states: Sequence[BackendState], settings: WeightSettings) -> list[float]:
    """factor_i per the module docstring, for each state in order."""
    speeds = [
        1.0 / s.latency.tpot_s
        if s.latency.tpot_s and s.latency.streams >= settings.min_samples
        else None
        for s in states
    ]
    known = [v for v in speeds if v is not None]
    if len(known) < 2:
        return [1.0] * len(states)
    top = max(known)
    return [1.0 if v is None else min(1.0, max(FLOOR, v / top)) for v in speeds]
