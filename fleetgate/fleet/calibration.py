"""Self-calibrating weights: a backend's share follows its measured speed, so an H100 gets more
than an A100 without anyone typing a weight, and a backend that slows down (thermal
throttling) gets less until it recovers.

    speed_i  = 1 / c_i, e_i    c_i: the engine's compute per token, fitted from its step
                               metrics (fleet/step_fit.py); e_i: its relative standard error.
                               Trusted after `min_intervals` scrape intervals with decoding,
                               over points that spread and rise, once e_i <= `max_error`
    factor_i = clamp(speed_i / speed_f * exp(hypot(e_i, e_f)), FLOOR, 1)
                               f: the fastest trusted backend. A ratio counts only beyond one
                               standard error of it: noise does not split equal GPUs, and a
                               speed leaves the prior gradually as its error shrinks
             = 1               while speed_i is not trusted, or fewer than two are (the prior)
    weight_i = configured weight_i * factor_i * slow-start share_i           (fleet/pool.py)
A fresh fleet so keeps its configured weights until its measurements can tell its GPUs apart.
At low load they cannot (fleet/step_fit.py: prompts prefilled in steps no inter-token gap
times flatten the line), and before speeds needed confidence the built-in fleet's H100 was
weighted 0.31 of its A100 within its first 50 short requests. Recomputed every `interval_s`.
The speed does not depend on the load routing gives (a busier engine runs bigger, longer steps
on the same line), so weights and load do not chase each other. A typed weight still
multiplies: with calibration on it states a preference (0.5: half its measured share), not the
hardware's speed. Backends that do not report vLLM V1's step histograms keep factor 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.step_fit import Speed
from fleetgate.settings import Settings, at_least, positive_seconds, within

FLOOR = 0.1  # no backend is weighted below this share of the fastest's


class WeightSettings(Settings, frozen=True):
    """A pool's `weights:` section."""

    calibrate: bool = True  # weights follow each backend's measured speed
    interval_s: float = 5.0  # between two recalibrations
    min_intervals: int = 8  # scrape intervals with decoding before a speed is trusted
    max_error: float = 0.25  # a speed is trusted once its standard error is this share of it

    def __post_init__(self) -> None:
        positive_seconds("interval_s", self.interval_s)
        at_least("min_intervals", self.min_intervals, 1)
        within("max_error", self.max_error, 0, 1, open_low=True)


def speed_factors(states: Sequence[BackendState], settings: WeightSettings) -> list[float]:
    """factor_i per the module docstring, for each state in order."""
    speeds = [s.step_fit.speed(settings.min_intervals, settings.max_error) for s in states]
    known = [v for v in speeds if v is not None]
    if len(known) < 2:
        return [1.0] * len(states)
    fastest = max(known, key=lambda v: v.tokens_per_s)
    return [1.0 if v is None else factor(v, fastest) for v in speeds]


def factor(speed: Speed, fastest: Speed) -> float:
    """factor_i of a trusted speed against the pool's fastest, per the module docstring."""
    ratio = speed.tokens_per_s / fastest.tokens_per_s
    return min(1.0, max(FLOOR, ratio * math.exp(math.hypot(speed.error, fastest.error))))
