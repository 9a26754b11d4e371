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

No speed (None) until `min_points` intervals with decoding have been seen, or while the points
do not spread along x (relative std under MIN_SPREAD: an idle or steady engine, whose slope the
points cannot tell), or if the fitted slope is not positive.
"""

from __future__ import annotations

import math

from fleetgate.fleet.engine_load import StepTotals

DECAY = 0.95  # each older interval counts this much less: ~20 intervals of memory
MIN_SPREAD = 0.1  # std / mean of x needed before a slope is fitted


class StepFit:
    """Exponentially weighted least squares of step time against tokens per step."""

    __slots__ = ("_last", "_sums", "points")

    def __init__(self) -> None:
        self._last: StepTotals | None = None
        self._sums = [0.0] * 5  # weight, x, y, x * x, x * y, each weighted and decayed
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
        for i, value in enumerate((steps, steps * x, steps * y, steps * x * x, steps * x * y)):
            sums[i] = sums[i] * DECAY + value
        self.points += 1

    def speed(self, min_points: int) -> float | None:
        """Tokens per second of compute (1 / c), per the module docstring; None if unknown."""
        if self.points < min_points:
            return None
        w, sx, sy, sxx, sxy = self._sums
        mx, my = sx / w, sy / w
        var = sxx / w - mx * mx
        if var <= 0 or math.sqrt(var) < MIN_SPREAD * mx:
            return None
        slope = (sxy / w - mx * my) / var
        return 1.0 / slope if slope > 0 else None
