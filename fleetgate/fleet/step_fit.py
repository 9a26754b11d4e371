"""How fast a backend's engine computes, fitted from its own step metrics whatever its load.

Between two scrapes a vLLM V1 engine's histograms (fleet/engine_load.py, StepTotals) say how
many steps it ran and how many tokens they computed, and how many inter-token gaps its decoding
requests saw and their total time. Each scrape interval is one point
    x = d tokens / d steps        mean tokens computed per step
    y = d gap time / d gaps       mean step time, as the requests decoding in them saw it
and a step takes about y = a + c * x (a: the fixed cost of a step, launch overhead and reading
the weights; c: the compute of one token). A least-squares line through the recent points,
each weighted by its steps and by DECAY ** (points since), gives
    c = cov(x, y) / var(x)        a = mean(y) - c * mean(x)
and the engine's speed = 1 / c: tokens per second when saturated, its throughput. A latency
measured under load moves with the load routing gives it; this does not: a busier engine runs
more tokens per step and longer steps, further along the same line. A throttled GPU's steps all
take longer, so its slope, and its speed, change within a few intervals.

How close it comes, measured on the sim's engine (azure-conv prompts, 1 s scrapes at slowdown
4): the H100 8B profile's c is fitted at 25.6-26.7 us against the modelled 26.0 at every load,
the A100's at 66.6-73.0 against 70.5 (its decode-only steps sit below the roofline's knee, which
bends the line). The H100:A100 speed ratio comes out 2.5-2.7, against 2.71 of pure compute.

At low load the line is not the compute's. A prompt that reaches an engine with nothing else
decoding is prefilled in a step that no inter-token gap times, so its tokens raise x and leave
y at the weights-bound decode steps' time: the points lie flat and the slope comes out near
zero (a "speed" of millions of tokens a second), or rests on the one interval where a prefill
happened to share a step with decodes. Replaying the built-in fleet's first short requests
(tests/fleet/test_calibration.py), such fits put the H100 at 1.6 us a token and the A100 at
0.5, and the H100 was weighted 0.31 of the A100. So a speed is trusted only with confidence:
    n     = (sum w)^2 / sum w^2            effective number of points (w: their weights)
    s^2   = var(y) - c * cov(x, y)         the line's weighted mean squared residual
    e     = sqrt(s^2 / ((n - 2) var(x))) / c
                                           the slope's standard error over the slope: the
                                           speed's relative error (fleet/calibration.py)
    speed = 1 / c  when  points >= min_points         (enough intervals with decoding)
                   and   sd(x) >= MIN_SPREAD mean(x)  (they spread along x)
                   and   c sd(x) >= MIN_RISE mean(y)  (the line visibly rises over them)
                   and   e <= max_error               (the slope is known to that share)
    None           otherwise
The rise rules out the flat low-load lines, however consistent their points (their error can
be small); the error rules out slopes that rest on a few noisy or far-out intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetgate.fleet.engine_load import StepTotals

DECAY = 0.95  # each older interval counts this much less: ~20 intervals of memory
MIN_SPREAD = 0.1  # std / mean of x needed before a slope is fitted
# Least rise of the line over one std of x, as a share of the mean step time. In replays of the
# built-in fleet (tests/fleet/test_calibration.py) the flat low-load fits rise 0.1-1.5%, and
# those that find the compute (H100 15-29 us a token, A100 39-54 us) 3-9%.
MIN_RISE = 0.03


@dataclass(frozen=True, slots=True)
class Speed:
    """A trusted fit: the engine's speed and how well it is known."""

    tokens_per_s: float  # 1 / c
    error: float  # e: the relative standard error of c, and so of the speed


class StepFit:
    """Exponentially weighted least squares of step time against tokens per step."""

    __slots__ = ("_last", "_square_weights", "_sums", "points")

    def __init__(self) -> None:
        self._last: StepTotals | None = None
        # weight, x, y, x * x, x * y, y * y: each weighted and decayed
        self._sums = [0.0] * 6
        self._square_weights = 0.0  # weight ** 2, decayed alike: for the effective count
        self.points = 0  # intervals taken in

    def add(self, totals: StepTotals) -> None:
        """Take the engine's running totals as of a new scrape."""
        last, self._last = self._last, totals
        if last is None:
            return
        steps, gaps = totals.steps - last.steps, totals.gaps - last.gaps
        if steps <= 0 or gaps <= 0:  # idle, or the engine restarted and its totals with it
            return
        x = (totals.tokens - last.tokens) / steps
        y = (totals.gap_s - last.gap_s) / gaps
        sums = self._sums
        values = (steps, steps * x, steps * y, steps * x * x, steps * x * y, steps * y * y)
        for i, value in enumerate(values):
            sums[i] = sums[i] * DECAY + value
        self._square_weights = self._square_weights * DECAY * DECAY + steps * steps
        self.points += 1

    def speed(self, min_points: int, max_error: float) -> Speed | None:
        """Tokens per second of compute (1 / c) and its error, when trusted per the module
        docstring; None while it is not."""
        if self.points < min_points:
            return None
        w, sx, sy, sxx, sxy, syy = self._sums
        mx, my = sx / w, sy / w
        var_x = sxx / w - mx * mx
        if var_x <= 0 or math.sqrt(var_x) < MIN_SPREAD * mx:
            return None
        cov = sxy / w - mx * my
        slope = cov / var_x
        if slope <= 0 or slope * math.sqrt(var_x) < MIN_RISE * my:
            return None
        n = w * w / self._square_weights
        if n <= 2:
            return None
        residual = max(0.0, syy / w - my * my - slope * cov)  # rounding can take it below 0
        error = math.sqrt(residual / ((n - 2) * var_x)) / slope
        return Speed(1.0 / slope, error) if error <= max_error else None
