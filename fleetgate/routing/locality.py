"""`locality` filter: a request stays as near the gateway as it can be served. The candidates
kept are the nearest tier that has any:

    1. the gateway's own zone (when `prefer_zone` and the gateway knows its zone)
    2. the gateway's own region
    3. the nearest other region: the one whose backends answered this gateway soonest (the
       least time to first token any of them has shown; one never measured comes after, and
       among those never measured one is drawn at random)
    4. backends with no `region` label

A backend's place is its `region` and `zone` labels; the gateway's is `server.region` and
`server.zone` (or FLEETGATE_REGION and FLEETGATE_ZONE). A gateway that knows no region keeps
every candidate. The filter is one stage of any profile: the scorers and picker then choose
within the tier, as they would in a one-region fleet. O(n) over the candidates.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from fleetgate.fleet.backend import REGION, ZONE, BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.settings import Settings


@dataclass(frozen=True, slots=True)
class Place:
    """Where something runs: its region and zone (None: not said)."""

    region: str | None = None
    zone: str | None = None


NOWHERE = Place()  # a gateway that knows not where it runs
NOMINEES = 8  # of the nearest tier, named for a shortlist (half the default shortlist)
RECHECK_S = 1.0  # the other regions' order is looked at again this often


class LocalityParams(Settings, frozen=True):
    """The `locality` filter's parameters."""

    prefer_zone: bool = True  # the gateway's own zone before the rest of its region


class Locality:
    """The filter (module docstring). In a pool larger than the shortlist it also names the
    nearest tier's backends (`nominate`: a sample of them, from the whole pool it is told of),
    so a shortlist holds some whenever the pool has any, and the tier kept is the pool's
    nearest, not the sample's."""

    name = "locality"

    def __init__(self, params: LocalityParams, here: Place, rng: random.Random) -> None:
        self._zone = here.zone if params.prefer_zone else None
        self._region = here.region
        self._rng = rng
        self._near: list[str] = []  # the ids of the whole pool's nearest tier
        # The last candidates filtered, what was kept of them, and until when that holds (the
        # same list while the pool's are the same: pickers index a list by its identity; the
        # other regions' order follows their latency, looked at again each RECHECK_S).
        self._seen: Sequence[BackendState] = ()
        self._kept: Sequence[BackendState] = ()
        self._until = -math.inf

    def roster(self, candidates: Sequence[BackendState]) -> None:
        self._near = [s.backend.id for s in self._nearest(candidates)]

    def nominate(self, request: RoutingRequest, now: float) -> list[str]:
        near = self._near
        return near if len(near) <= NOMINEES else self._rng.sample(near, NOMINEES)

    def filter(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> Sequence[BackendState]:
        if self._region is None:
            return candidates
        if candidates is not self._seen or now >= self._until:
            self._seen, self._kept = candidates, self._nearest(candidates)
            self._until = now + RECHECK_S
        return self._kept

    def _nearest(self, candidates: Sequence[BackendState]) -> Sequence[BackendState]:
        local = [s for s in candidates if s.backend.labels.get(REGION) == self._region]
        if not local:
            return _nearest_region(candidates, self._rng)
        zone = self._zone
        same = [] if zone is None else [s for s in local if s.backend.labels.get(ZONE) == zone]
        return same or local


def _nearest_region(
    candidates: Sequence[BackendState], rng: random.Random
) -> Sequence[BackendState]:
    """The candidates of the region that answered soonest (unlabelled ones last; among
    regions never measured, one drawn at random)."""
    by_region: dict[str | None, list[BackendState]] = {}
    for state in candidates:
        by_region.setdefault(state.backend.labels.get(REGION), []).append(state)

    def distance(region: str | None) -> tuple[bool, float, float]:
        seen = [s.latency.ttft_s for s in by_region[region] if s.latency.ttft_s is not None]
        return region is None, min(seen, default=math.inf), rng.random()

    return by_region[min(by_region, key=distance)] if by_region else candidates
