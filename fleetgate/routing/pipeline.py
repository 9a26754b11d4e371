"""A routing pipeline: filters narrow the candidates, scorers rate them, one picker chooses."""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import Filter, Picker, RoutingRequest, Scorer


class RoutingPipeline:
    """filters -> weighted scorers -> picker.

    The combined score of a candidate is sum(w_i * s_i) / sum(w_i) over the scorers, so it stays
    in [0, 1]. With no scorers the picker decides alone (round robin, power of two, ...).
    """

    __slots__ = ("_filters", "_scorers", "_total_weight", "picker")

    def __init__(
        self,
        picker: Picker,
        filters: Sequence[Filter] = (),
        scorers: Sequence[tuple[Scorer, float]] = (),
    ) -> None:
        self.picker = picker
        self._filters = tuple(filters)
        self._scorers = tuple(scorers)
        self._total_weight = sum(w for _, w in scorers)

    def pick(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> BackendState | None:
        """The chosen backend, or None when no candidate survives the filters."""
        for f in self._filters:
            candidates = f.filter(request, candidates, now)
        if not candidates:
            return None
        if not self._scorers:
            return self.picker.pick(request, candidates, None, now)
        combined = [0.0] * len(candidates)
        for scorer, weight in self._scorers:
            for i, s in enumerate(scorer.score(request, candidates, now)):
                combined[i] += weight * s
        total = self._total_weight or 1.0
        return self.picker.pick(request, candidates, [c / total for c in combined], now)
