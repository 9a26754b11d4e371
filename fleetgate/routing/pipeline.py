"""A routing pipeline: filters narrow the candidates, scorers rate them, one picker chooses."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import (
    Filter,
    Learner,
    Nominator,
    Picker,
    Roster,
    RoutingRequest,
    Scorer,
    Watcher,
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
        "_learns", "_member_ids", "_members", "_nominators", "_picks", "_plain", "_rng",
        "_rosters", "_scorer_names", "_shortlist", "_time_every", "_timed", "_timer", "picker",
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
        total = sum(w for _, w in scorers) or 1.0
        shares = tuple(weight / total for _, weight in scorers)
        self._plain = _Plugins(
            picker, tuple(filters), tuple(s for s, _ in scorers), shares, _Draw(self._shortlisted)
        )
        self._learns = tuple(isinstance(s, Learner) for s, _ in scorers)
        self._scorer_names = tuple(plugin_name(s) for s, _ in scorers)
        plugins = (*(s for s, _ in scorers), *filters)
        self._nominators = tuple(p for p in plugins if isinstance(p, Nominator))
        self._rosters = tuple(p for p in plugins if isinstance(p, Roster))
        self._shortlist = max(1, shortlist)
        self._rng = rng or random.Random(0)
        self._timer: PluginTimer | None = None
        self._timed: _Plugins | None = None  # the plugins' stopwatches, while timing
        self._time_every = TIME_EVERY
        self._picks = 0  # since the last timed one
        self._members: Sequence[BackendState] | None = None
        self._member_ids: dict[str, BackendState] = {}  # the members, by backend id

    @property
    def scorers(self) -> tuple[Scorer, ...]:
        return self._plain.scorers

    @property
    def filters(self) -> tuple[Filter, ...]:
        return self._plain.filters

    def watch(
        self,
        members: Callable[[], Sequence[BackendState]],
        candidates: Callable[[], Sequence[BackendState]],
    ) -> None:
        """Where its filters that judge the pool as a whole read its members and candidates
        (its router tells it: routing/router.py)."""
        for f in self._plain.filters:
            if isinstance(f, Watcher):
                f.watch(members, candidates)

    def set_timer(self, timer: PluginTimer | None, every: int = TIME_EVERY) -> None:
        """Time each plugin's calls in one pick of `every` from now on (None: stop): a
        histogram of plugin times needs a sample, not every pick. A timed pick runs over
        stopwatches standing in for the plugins; the others call the plugins themselves,
        with no clock read and no call to spare."""
        self._timer = timer
        self._time_every = max(1, every)
        plain = self._plain
        self._timed = None if timer is None else _Plugins(
            _Stopwatch(plain.picker), tuple(_Stopwatch(f) for f in plain.filters),
            tuple(_Stopwatch(s) for s in plain.scorers), plain.shares, _Stopwatch(plain.draw),
        )  # fmt: skip

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        now: float,
        explain: dict[str, float] | None = None,
    ) -> BackendState | None:
        """The chosen backend, or None when no candidate survives the filters. In a timed
        pick each plugin's time (a scorer's scoring and learning together, a filter's passes
        together) goes to the timer. `explain`, when given, receives each scorer's score of
        the chosen backend (by plugin name; nothing when there was nothing to compare), for
        whoever wants to see why."""
        timed = self._timed
        if timed is not None:
            self._picks += 1
            if self._picks >= self._time_every:
                self._picks = 0
                return self._timed_pick(timed, request, candidates, now, explain)
        return self._pick(self._plain, request, candidates, now, explain)

    def _timed_pick(
        self,
        plugins: _Plugins,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        now: float,
        explain: dict[str, float] | None,
    ) -> BackendState | None:
        assert self._timer is not None  # set with the stopwatches
        chosen = self._pick(plugins, request, candidates, now, explain)
        for watch in plugins.stopwatches():
            if watch.calls:
                self._timer(watch.name, watch.spent)
                watch.calls, watch.spent = 0, 0.0
        return chosen

    def _pick(
        self,
        plugins: _Plugins,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        now: float,
        explain: dict[str, float] | None,
    ) -> BackendState | None:
        scorers, shares = plugins.scorers, plugins.shares
        if scorers and len(candidates) > self._shortlist:
            shortlist = plugins.draw.shortlist(request, candidates, now)
            # Filters narrow the shortlist; only when it holds none they keep, the whole pool.
            kept = _filtered(plugins.filters, request, shortlist, now)
            candidates = kept or _filtered(plugins.filters, request, candidates, now)
        else:
            candidates = _filtered(plugins.filters, request, candidates, now)
        if not candidates:
            return None
        if scorers and len(candidates) == 1:  # nothing to compare: no scoring, only learning
            chosen = candidates[0]
        else:
            combined: list[float] | None = None
            each: list[list[float]] | None = [] if explain is not None else None
            if scorers:
                combined = [0.0] * len(candidates)
                for scorer, share in zip(scorers, shares, strict=True):
                    scores = scorer.score(request, candidates, now)
                    combined = [c + share * s for c, s in zip(combined, scores, strict=True)]
                    if each is not None:  # kept only to explain
                        each.append(scores)
            chosen = plugins.picker.pick(request, candidates, combined, now)
            if each and explain is not None:  # (each is None unless explaining)
                at = candidates.index(chosen)
                for name, scores in zip(self._scorer_names, each, strict=True):
                    explain[name] = scores[at]
        for scorer, learns in zip(scorers, self._learns, strict=True):
            if learns:
                scorer.chosen(request, chosen, now)  # type: ignore[attr-defined]
        return chosen

    def _shortlisted(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[BackendState]:
        if candidates is not self._members:  # the pool rebuilds its tuple on health changes
            self._members = candidates
            self._member_ids = {state.backend.id: state for state in candidates}
            for roster in self._rosters:
                roster.roster(candidates)
        members, size = self._member_ids, self._shortlist
        picked: dict[BackendState, None] = {}
        for nominator in self._nominators:
            for backend in nominator.nominate(request, now):
                state = members.get(backend)
                if state is not None:
                    picked[state] = None
                    if len(picked) * 2 >= size:
                        break
        for i in self._rng.sample(range(len(candidates)), size):
            if len(picked) >= size:
                break
            picked[candidates[i]] = None
        return list(picked)


def _filtered(
    filters: Sequence[Filter],
    request: RoutingRequest,
    candidates: Sequence[BackendState],
    now: float,
) -> Sequence[BackendState]:
    """What every filter keeps of `candidates`."""
    for f in filters:
        candidates = f.filter(request, candidates, now)
    return candidates


@dataclass(frozen=True, slots=True)
class _Plugins:
    """A pipeline's plugins, or the stopwatches standing in for them in a timed pick."""

    picker: Picker
    filters: tuple[Filter, ...]
    scorers: tuple[Scorer, ...]
    shares: tuple[float, ...]  # each scorer's weight over the scorers' total
    draw: _Draw | _Stopwatch  # the shortlist of a large pool

    def stopwatches(self) -> Iterator[_Stopwatch]:
        for plugin in (self.picker, *self.filters, *self.scorers, self.draw):
            if isinstance(plugin, _Stopwatch):
                yield plugin


class _Draw:
    """The pipeline's own step that draws a large pool's shortlist, timed as a plugin is."""

    __slots__ = ("shortlist",)
    name = "shortlist"

    def __init__(
        self, draw: Callable[[RoutingRequest, Sequence[BackendState], float], list[BackendState]]
    ) -> None:
        self.shortlist = draw


class _Stopwatch:
    """A plugin in a timed pick: it calls the plugin, adding the time each call takes."""

    __slots__ = ("_plugin", "calls", "name", "spent")

    def __init__(self, plugin: Picker | Filter | Scorer | _Draw) -> None:
        self._plugin: Any = plugin
        self.name = plugin_name(plugin)
        self.calls = 0
        self.spent = 0.0

    def _timed(self, method: str, *args: Any) -> Any:
        start = perf_counter()
        try:
            return getattr(self._plugin, method)(*args)
        finally:
            self.calls += 1
            self.spent += perf_counter() - start

    def filter(self, request: RoutingRequest, candidates: Sequence[BackendState],
               now: float) -> Sequence[BackendState]:  # fmt: skip
        kept: Sequence[BackendState] = self._timed("filter", request, candidates, now)
        return kept

    def score(self, request: RoutingRequest, candidates: Sequence[BackendState],
              now: float) -> list[float]:  # fmt: skip
        scores: list[float] = self._timed("score", request, candidates, now)
        return scores

    def pick(self, request: RoutingRequest, candidates: Sequence[BackendState],
             scores: Sequence[float] | None, now: float) -> BackendState:  # fmt: skip
        chosen: BackendState = self._timed("pick", request, candidates, scores, now)
        return chosen

    def chosen(self, request: RoutingRequest, state: BackendState, now: float) -> None:
        self._timed("chosen", request, state, now)

    def shortlist(self, request: RoutingRequest, candidates: Sequence[BackendState],
                  now: float) -> list[BackendState]:  # fmt: skip
        drawn: list[BackendState] = self._timed("shortlist", request, candidates, now)
        return drawn
