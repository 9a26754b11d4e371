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
TIME_EVERY = 16  # with a timer set, one pick in this many is timed

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
    shortlist instead: the backends its plugins nominate (where the prompt's prefix is cached,
    the session's home, the fast backends a long prompt is kept to) and random others up to
    `shortlist`, as "power of d choices" does. A
    pick then costs O(shortlist) whatever the pool's size. Filters then narrow the shortlist,
    not the pool, so they cost O(shortlist) too; a filter that keeps none of the shortlist is
    given the whole pool (a backend that passes it is never missed, at O(n) for that pick).
    After the pick, scorers that learn from decisions (the prefix index, session homes) are
    told which backend was chosen.
    """

    __slots__ = (
        "_filters", "_learns", "_member_set", "_members", "_names", "_nominators",
        "_picks", "_rng", "_rosters", "_scorers", "_shortlist", "_time_every", "_timed",
        "_timer", "picker",
    )  # fmt: skip

    def __init__(
        self,
        picker: Picker,
        filters: Sequence[Filter] = (),
        scorers: Sequence[tuple[Scorer, float]] = (),
        *,
        shortlist: int = SHORTLIST,
        rng: random.Random | None = None,
    ) -> None:
        self.picker = picker
        self._filters = tuple(filters)
        total = sum(w for _, w in scorers) or 1.0
        self._scorers = tuple((scorer, weight / total) for scorer, weight in scorers)
        self._learns = tuple(isinstance(s, Learner) for s, _ in scorers)
        plugins = (*(s for s, _ in scorers), *filters)
        self._nominators = tuple(p for p in plugins if isinstance(p, Nominator))
        self._rosters = tuple(p for p in plugins if isinstance(p, Roster))
        self._names = {id(p): plugin_name(p) for p in (picker, *filters, *(s for s, _ in scorers))}
        self._shortlist = max(1, shortlist)
        self._rng = rng or random.Random(0)
        self._timer: PluginTimer = _ignore
        self._timed = False
        self._time_every = TIME_EVERY
        self._picks = 0  # since the last timed one
        self._members: Sequence[BackendState] | None = None
        self._member_set: frozenset[BackendState] = frozenset()

    @property
    def scorers(self) -> tuple[Scorer, ...]:
        return tuple(scorer for scorer, _ in self._scorers)

    def set_timer(self, timer: PluginTimer | None, every: int = TIME_EVERY) -> None:
        """Time each plugin's calls in one pick of `every` from now on (None: stop): a
        histogram of plugin times needs a sample, not every pick (timing all of them cost
        the metrics 1.5 us a request, six clock reads and six observations)."""
        self._timer = timer or _ignore
        self._timed = timer is not None
        self._time_every = max(1, every)

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        now: float,
        explain: dict[str, float] | None = None,
    ) -> BackendState | None:
        """The chosen backend, or None when no candidate survives the filters. Each plugin's
        time (a scorer's scoring and learning together) goes to the timer, if one is set.
        `explain`, when given, receives each scorer's score of the chosen backend (by plugin
        name; nothing when there was nothing to compare), for whoever wants to see why."""
        timer: PluginTimer = _ignore
        clock: Callable[[], float] = _zero
        names = self._names
        if self._timed:
            self._picks += 1
            if self._picks >= self._time_every:
                self._picks = 0
                timer, clock = self._timer, perf_counter
        scorers, filters = self._scorers, self._filters
        filtering = [0.0] * len(filters)  # each filter's time, over one or two passes
        if scorers and len(candidates) > self._shortlist:
            start = clock()
            shortlist = self._shortlisted(request, candidates, now)
            timer("shortlist", clock() - start)
            # Filters narrow the shortlist; only when it holds none they keep, the whole pool.
            kept = self._filtered(request, shortlist, now, filtering, clock)
            candidates = kept or self._filtered(request, candidates, now, filtering, clock)
        else:
            candidates = self._filtered(request, candidates, now, filtering, clock)
        for f, seconds in zip(filters, filtering, strict=True):
            timer(names[id(f)], seconds)
        if not candidates:
            return None
        spent = [0.0] * len(scorers)
        if scorers and len(candidates) == 1:  # nothing to compare: no scoring, only learning
            chosen = candidates[0]
        else:
            combined: list[float] | None = None
            each: list[list[float]] | None = [] if explain is not None else None
            if scorers:
                combined = [0.0] * len(candidates)
                for i, (scorer, share) in enumerate(scorers):
                    start = clock()
                    scores = scorer.score(request, candidates, now)
                    combined = [c + share * s for c, s in zip(combined, scores, strict=True)]
                    spent[i] = clock() - start
                    if each is not None:  # kept only to explain
                        each.append(scores)
            start = clock()
            chosen = self.picker.pick(request, candidates, combined, now)
            timer(names[id(self.picker)], clock() - start)
            if each and explain is not None:  # (each is None unless explaining)
                at = candidates.index(chosen)
                for (scorer, _), scores in zip(scorers, each, strict=True):
                    explain[names[id(scorer)]] = scores[at]
        for i, (scorer, _) in enumerate(scorers):
            if self._learns[i]:
                start = clock()
                scorer.chosen(request, chosen, now)  # type: ignore[attr-defined]
                spent[i] += clock() - start
            timer(names[id(scorer)], spent[i])
        return chosen

    def _filtered(
        self,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        now: float,
        spent: list[float],
        clock: Callable[[], float],
    ) -> Sequence[BackendState]:
        """What every filter keeps of `candidates`, each filter's time added to `spent`."""
        for i, f in enumerate(self._filters):
            start = clock()
            candidates = f.filter(request, candidates, now)
            spent[i] += clock() - start
        return candidates

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


def _ignore(plugin: str, seconds: float) -> None:
    """The timer while none is set."""


def _zero() -> float:
    """The clock while no timer is set: timing costs two calls, not two clock reads."""
    return 0.0
