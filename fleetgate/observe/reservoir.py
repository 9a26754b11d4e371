"""A uniform sample of a stream of values, at a cost per value of a count and a comparison:
the live view's latency percentiles (observe/live.py, observe/live_regions.py)."""

from __future__ import annotations

import math
import random

SAMPLES = 256  # values kept by default


class Reservoir:
    """A uniform sample of at most `size` of the values offered (Li's Algorithm L: after the
    first `size`, a value is only looked at when a precomputed skip lands on it, so offering
    one costs a count and a comparison: `offer` is called only then)."""

    __slots__ = ("due", "seen", "size", "values", "weight")

    def __init__(self, size: int = SAMPLES) -> None:
        self.size = size
        self.values: list[float] = []
        self.seen = 0  # values offered so far, the caller counting
        self.due = 1  # the next value (by `seen`) that `offer` must be given
        self.weight = 1.0

    def offer(self, value: float, rng: random.Random) -> None:
        """The `seen`-th value, when it is `due` (the caller has counted it)."""
        size = self.size
        if self.seen <= size:
            self.values.append(value)
            if self.seen < size:
                self.due = self.seen + 1
                return
        else:
            self.values[rng.randrange(size)] = value
        self.weight *= math.exp(math.log(rng.random() or 1e-300) / size)
        skip = math.log(rng.random() or 1e-300) / math.log(1.0 - self.weight)
        self.due = self.seen + int(skip) + 1 if skip < _FAR else _NEVER


_FAR = 2.0**62
_NEVER = 2**62
