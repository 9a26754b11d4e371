"""A routing pipeline: filters narrow the candidates, scorers rate them, one picker chooses."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from time import perf_counter

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import (
    Filter,
    Learner,
    Nominator,
    Picker,
    Roster,
    RoutingRequest,
    Scorer,
)

SHORTLIST = 16  # scored profiles rate at most this many candidates per pick

PluginTimer = Callable[[str, float], None]  # (plugin name, seconds it took) per call


def plugin_name(plugin: object) -> str:
    """A plugin's name in metrics: its `name` attribute, else its class name."""
    name = getattr(plugin, "name", None)
    return name if isinstance(name, str) else type(plugin).__name__


class RoutingPipeline:
    """filters -> weighted scorers -> picker.

    The combined score of a candidate is sum(w_i * s_i) / sum(w_i) over the scorers, so it stays
    in [0, 1]. With no scorers the picker decides alone (round robin, power of two, ...).

    Scoring is O(candidates), so with more than `shortlist` candidates a scored pipeline rates a
    shortlist instead: the backends its scorers nominate (where the prompt's prefix is cached,
    the session's home) and random others up to `shortlist`, as "power of d choices" does. A
    pick then costs O(shortlist) whatever the pool's size. After the pick, scorers that learn
    from decisions (the prefix index, session homes) are told which backend was chosen.
    """

    __slots__ = (
        "_filters", "_learners", "_member_set", "_members", "_names", "_nominators", "_rng",
        "_rosters", "_scorers", "_shortlist", "_timer", "picker",
    )  # fmt: skip

    def __init__(
        self,
        picker: Picker,
        filters: Sequence[Filter] = (),
        scorers: Sequence[tuple[Scorer, float]] = (),
        *,
        shortlist: int = SHORTLIST,
        rng: random.Random | None = None,
        timer: PluginTimer | None = None,
    ) -> None:
        self.picker = picker
        self._filters = tuple(filters)
        total = sum(w for _, w in scorers) or 1.0
        self._scorers = tuple((scorer, weight / total) for scorer, weight in scorers)
        self._learners = tuple(s for s, _ in scorers if isinstance(s, Learner))
        self._nominators = tuple(s for s, _ in scorers if isinstance(s, Nominator))
        self._rosters = tuple(s for s, _ in scorers if isinstance(s, Roster))
        # For timing: each plugin's name, and each scorer's learning step (None if none).
        self._names = {id(p): plugin_name(p) for p in (picker, *filters, *(s for s, _ in scorers))}
        self._shortlist = max(1, shortlist)
        self._rng = rng or random.Random(0)
        self._timer = timer
        self._members: Sequence[BackendState] | None = None
        self._member_set: frozenset[BackendState] = frozenset()

    @property
    def scorers(self) -> tuple[Scorer, ...]:
        return tuple(scorer for scorer, _ in self._scorers)

    def set_timer(self, timer: PluginTimer | None) -> None:
        """Time every plugin call from now on (None: stop)."""
        self._timer = timer

    def pick(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> BackendState | None:
        """The chosen backend, or None when no candidate survives the filters."""
        if self._timer is not None:
            return self._timed_pick(request, candidates, now, self._timer)
        for f in self._filters:
            candidates = f.filter(request, candidates, now)
        if not candidates:
            return None
        if not self._scorers:
            return self.picker.pick(request, candidates, None, now)
        if len(candidates) == 1:  # nothing to compare: skip the scoring, keep the learning
            chosen = candidates[0]
            for learner in self._learners:
                learner.chosen(request, chosen, now)
            return chosen
        if len(candidates) > self._shortlist:
            candidates = self._shortlisted(request, candidates, now)
        combined: list[float] | None = None
        for scorer, share in self._scorers:
            scores = scorer.score(request, candidates, now)
            if combined is None:
                combined = [share * s for s in scores]
            else:
                combined = [c + share * s for c, s in zip(combined, scores, strict=True)]
        chosen = self.picker.pick(request, candidates, combined, now)
        for learner in self._learners:
            learner.chosen(request, chosen, now)
        return chosen

    def _timed_pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        now: float,
        timer: PluginTimer,
    ) -> BackendState | None:
        """`pick`, timing each plugin (its scoring and its learning together)."""
        names = self._names
        for f in self._filters:
            start = perf_counter()
            candidates = f.filter(request, candidates, now)
            timer(names[id(f)], perf_counter() - start)
        if not candidates:
            return None
        scored = bool(self._scorers)
        if scored and len(candidates) == 1:  # as in `pick`: no scoring, only the learning
            chosen = candidates[0]
            for learner in self._learners:
                start = perf_counter()
                learner.chosen(request, chosen, now)
                timer(names[id(learner)], perf_counter() - start)
            return chosen
        if scored and len(candidates) > self._shortlist:
            start = perf_counter()
            candidates = self._shortlisted(request, candidates, now)
            timer("shortlist", perf_counter() - start)
        combined = [0.0] * len(candidates) if scored else None
        spent: list[float] = []
        for scorer, share in self._scorers:
            start = perf_counter()
            scores = scorer.score(request, candidates, now)
            combined = [c + share * s for c, s in zip(combined or (), scores, strict=True)]
            spent.append(perf_counter() - start)
        start = perf_counter()
        chosen = self.picker.pick(request, candidates, combined, now)
        timer(names[id(self.picker)], perf_counter() - start)
        learners = self._learners
        for (scorer, _), seconds in zip(self._scorers, spent, strict=True):
            if scorer in learners:
                start = perf_counter()
                scorer.chosen(request, chosen, now)
                seconds += perf_counter() - start
            timer(names[id(scorer)], seconds)
        return chosen

    def _shortlisted(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[BackendState]:
        if candidates is not self._members:  # the pool rebuilds its tuple on health changes
            self._members, self._member_set = candidates, frozenset(candidates)
            for roster in self._rosters:
                roster.roster(candidates)
        members, size = self._member_set, self._shortlist
        picked: dict[BackendState, None] = {}
        for nominator in self._nominators:
            for state in nominator.nominate(request, now):
                if state in members:
                    picked[state] = None
                    if len(picked) * 2 >= size:
                        break
        for i in self._rng.sample(range(len(candidates)), size):
            if len(picked) >= size:
                break
            picked[candidates[i]] = None
        return list(picked)
