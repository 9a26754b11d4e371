"""Routing over a pool: its pipeline picks among the pool's candidates of the moment, only
those in the request's regions when its tenant's data must stay in them (every attempt, the
first, a retry, a hedge, a continuation or a prefill, is picked here: upstream/routed.py)."""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import REGION, BackendState
from fleetgate.fleet.pool import Pool
from fleetgate.routing.base import LoadTracker, RoutingRequest
from fleetgate.routing.pipeline import RoutingPipeline


class Router:
    """A pool and the pipeline that routes in it. A picker that keeps an index over in-flight
    counts or weights (routing/base.py `LoadTracker`) is told of every change to them."""

    __slots__ = ("_within", "pipeline", "pool")

    def __init__(self, pool: Pool, pipeline: RoutingPipeline) -> None:
        self.pool = pool
        self.pipeline = pipeline
        # Per set of regions, the candidates in them, with the candidates they were taken of:
        # the same list while the pool's are the same (pickers index a list by its identity).
        self._within: dict[frozenset[str], tuple[Sequence[BackendState], Sequence[BackendState]]]
        self._within = {}
        pipeline.watch(lambda: pool.states, lambda: pool.candidates)
        picker = pipeline.picker  # (a reloaded config's router replaces the last one's)
        pool.load_changed = picker.load_changed if isinstance(picker, LoadTracker) else None

    def pick(
        self, request: RoutingRequest, now: float, explain: dict[str, float] | None = None
    ) -> BackendState | None:
        """The pipeline's pick among the pool's candidates; `explain` as the pipeline's."""
        pool = self.pool
        if now >= pool.next_check:
            pool.update(now)
        candidates: Sequence[BackendState] = pool.candidates
        if request.regions is not None:
            candidates = self._in_regions(candidates, request.regions)
        if not candidates:
            return None
        if request.pinned is not None:  # only it holds what the request continues
            for state in candidates:
                if state.backend.id == request.pinned:
                    return state
        return self.pipeline.pick(request, candidates, now, explain)

    def _in_regions(
        self, candidates: Sequence[BackendState], regions: frozenset[str]
    ) -> Sequence[BackendState]:
        kept = self._within.get(regions)
        if kept is None or kept[0] is not candidates:
            kept = self._within[regions] = (candidates, within(candidates, regions))
        return kept[1]

    def pick_other(
        self,
        request: RoutingRequest,
        now: float,
        tried: Sequence[BackendState],
        explain: dict[str, float] | None = None,
        *,
        elsewhere: bool = False,
    ) -> BackendState | None:
        """A pick among the candidates not in `tried` (a retry, a hedge, a continuation);
        O(n), only then. `elsewhere` (after a failure): outside the regions tried, while any
        candidate there may serve it (Envoy's previous_priorities: when a region dies, its
        other backends are not yet out of rotation, and a retry to each of them in turn
        failed the request)."""
        pool = self.pool
        if now >= pool.next_check:
            pool.update(now)
        others: Sequence[BackendState] = [s for s in pool.candidates if s not in tried]
        if request.regions is not None:
            others = within(others, request.regions)
        if elsewhere:
            others = _outside(others, tried) or others
        if not others:
            return None
        return self.pipeline.pick(request, others, now, explain)


def _outside(
    candidates: Sequence[BackendState], tried: Sequence[BackendState]
) -> Sequence[BackendState]:
    """The candidates in none of the regions of `tried` (all of them when none has one)."""
    regions = {s.backend.labels.get(REGION) for s in tried} - {None}
    if not regions:
        return candidates
    return [s for s in candidates if s.backend.labels.get(REGION) not in regions]


def within(candidates: Sequence[BackendState], regions: frozenset[str]) -> Sequence[BackendState]:
    """The candidates in `regions` (their `region` label; one without is in none): data
    residency, applied to every pick (routing/base.py `RoutingRequest.regions`)."""
    return [s for s in candidates if s.backend.labels.get(REGION) in regions]
