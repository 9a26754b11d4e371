"""`locality` filter: a request stays as near the gateway as it can be served. The candidates
kept are the nearest tier that has any:

    1. the gateway's own zone (when `prefer_zone` and the gateway knows its zone)
    2. the gateway's own region
    3. the nearest other region: the one whose backends answered this gateway soonest (the
       least time to first token any of them has shown; one never measured comes after)
    4. backends with no `region` label

A backend's place is its `region` and `zone` labels; the gateway's is `server.region` and
`server.zone` (or FLEETGATE_REGION and FLEETGATE_ZONE). A gateway that knows no region keeps
every candidate. The filter is one stage of any profile: the scorers and picker then choose
within the tier, as they would in a one-region fleet. O(n) over the candidates.
"""

from __future__ import annotations

import math
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


class LocalityParams(Settings, frozen=True):
    """The `locality` filter's parameters."""

    prefer_zone: bool = True  # the gateway's own zone before the rest of its region


class Locality:
    name = "locality"

    def __init__(self, params: LocalityParams, here: Place) -> None:
        self._zone = here.zone if params.prefer_zone else None
        self._region = here.region

    def filter(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> Sequence[BackendState]:
        region = self._region
        if region is None:
            return candidates
        local = [s for s in candidates if s.backend.labels.get(REGION) == region]
        if local:
            zone = self._zone
            if zone is not None:
                same = [s for s in local if s.backend.labels.get(ZONE) == zone]
                return same or local
            return local
        return _nearest_region(candidates)


def _nearest_region(candidates: Sequence[BackendState]) -> Sequence[BackendState]:
    """The candidates of the region that answered soonest (unlabelled ones last)."""
    by_region: dict[str | None, list[BackendState]] = {}
    for state in candidates:
        by_region.setdefault(state.backend.labels.get(REGION), []).append(state)

    def distance(region: str | None) -> tuple[bool, float, str]:
        seen = [s.latency.ttft_s for s in by_region[region] if s.latency.ttft_s is not None]
        return region is None, min(seen, default=math.inf), region or ""

    return by_region[min(by_region, key=distance)]
