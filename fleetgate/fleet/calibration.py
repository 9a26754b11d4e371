"""Self-calibrating weights: a backend's share follows its measured speed, so an H100 gets more
than an A100 without anyone typing a weight, and a backend that slows down (thermal
throttling) gets less until it recovers.

    speed_i  = 1 / c_i         c_i: the engine's compute per token, fitted from its step
                               metrics (fleet/step_fit.py), trusted after `min_intervals`
                               scrape intervals with decoding
    factor_i = clamp(speed_i / max_j speed_j, FLOOR, 1)          (1 while unmeasured)
    weight_i = configured weight_i * factor_i * slow-start share_i           (fleet/pool.py)
Recomputed every `interval_s`. The speed does not depend on the load routing gives (a busier
engine runs bigger, longer steps on the same line), so weights and load do not chase each
other. A typed weight still multiplies: with calibration on it states a preference (0.5: half
its measured share), not the hardware's speed. Backends that do not report vLLM V1's step
histograms keep factor 1.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.settings import Settings, at_least, positive_seconds

FLOOR = 0.1  # no backend is weighted below this share of the fastest's


class WeightSettings(Settings, frozen=True):
    """A pool's `weights:` section."""

    calibrate: bool = True  # weights follow each backend's measured speed
    interval_s: float = 5.0  # between two recalibrations
    min_intervals: int = 8  # scrape intervals with decoding before a speed is trusted

    def __post_init__(self) -> None:
        positive_seconds("interval_s", self.interval_s)
        at_least("min_intervals", self.min_intervals, 1)


def speed_factors(states: Sequence[BackendState], settings: WeightSettings) -> list[float]:
    """factor_i per the module docstring, for each state in order."""
    speeds = [s.step_fit.speed(settings.min_intervals) for s in states]
    known = [v for v in speeds if v is not None]
    if len(known) < 2:
        return [1.0] * len(states)
    top = max(known)
    return [1.0 if v is None else min(1.0, max(FLOOR, v / top)) for v in speeds]
