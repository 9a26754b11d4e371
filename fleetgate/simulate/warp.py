"""Traffic surges: the workload's own clock run faster for a while. A surge of factor k from
`at_s` for `duration_s` plays k seconds of the workload (a trace's times, or its Poisson
process) in each of those seconds; after it the workload goes on at its own pace, from where
the surge left it. Surges that overlap multiply."""

from __future__ import annotations

import bisect
from collections.abc import Iterable


class Warp:
    """Maps the workload's times to the simulation's."""

    def __init__(self, surges: Iterable[tuple[float, float, float]]) -> None:
        """`surges`: (start, duration, factor) each, in simulated seconds."""
        listed = list(surges)
        edges = sorted({0.0, *(t for s, d, _ in listed for t in (s, s + d))})
        self._starts: list[float] = []  # simulated time of each piece's start
        self._workload: list[float] = []  # the workload's time there
        self._rates: list[float] = []  # workload seconds per simulated second in the piece
        played = 0.0
        for i, start in enumerate(edges):
            rate = 1.0
            for s, d, k in listed:
                if s <= start < s + d:
                    rate *= k
            self._starts.append(start)
            self._workload.append(played)
            self._rates.append(rate)
            if i + 1 < len(edges):
                played += (edges[i + 1] - start) * rate

    def at(self, workload_s: float) -> float:
        """When the workload's time `workload_s` (>= 0) comes, in simulated time."""
        i = max(0, bisect.bisect_right(self._workload, workload_s) - 1)
        return self._starts[i] + (workload_s - self._workload[i]) / self._rates[i]

    def played(self, simulated_s: float) -> float:
        """How much of the workload has been played by the simulated time `simulated_s`."""
        i = max(0, bisect.bisect_right(self._starts, simulated_s) - 1)
        return self._workload[i] + (simulated_s - self._starts[i]) * self._rates[i]
