"""`locality` filter: a request stays as near the gateway as it can be served. The candidates
kept are the nearest tier that has any:

    1. the gateway's own zone (when `prefer_zone` and the gateway knows its zone)
    2. the gateway's own region
    3. the nearest other region: the one whose backends' health probes came back to this
       gateway soonest (the least round trip any of them has shown: its distance, whatever
       its load); without probes, the one that gave the least time to first token; one never
       measured comes after, and among those never measured one is drawn at random
    4. backends with no `region` label

and, when the gateway's region is saturated, down or coming back (routing/regions.py), a share
of the requests goes to the next tier instead: spillover, failover, recovery. Backends
labelled `standby: "true"` are in a tier only while their region needs them (regions.py).

A backend's place is its `region` and `zone` labels; the gateway's is `server.region` and
`server.zone` (or FLEETGATE_REGION and FLEETGATE_ZONE). A gateway that knows no region treats
the whole pool as its region (so standbys still wait, and nothing spills). The filter is one
stage of any profile: the scorers and picker then choose within the tier, as they would in a
one-region fleet. The tiers are worked out once a second and when the candidates change
(O(n)); a pick between costs a comparison, and a random draw while a share spills.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fleetgate.fleet.backend import REGION, STANDBY, ZONE, BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import CandidateLoads
from fleetgate.routing.regions import LocalRegion, Phase, RecoveryParams, SpillParams
from fleetgate.settings import Settings, within


@dataclass(frozen=True, slots=True)
class Place:
    """Where something runs: its region and zone (None: not said)."""

    region: str | None = None
    zone: str | None = None


NOWHERE = Place()  # a gateway that knows not where it runs
NOMINEES = 8  # of the nearest tier, named for a shortlist (half the default shortlist)
RECHECK_S = 1.0  # the region's state and the other regions' order are looked at again this often
Tier = Sequence[BackendState]


class LocalityParams(Settings, frozen=True):
    """The `locality` filter's parameters."""

    prefer_zone: bool = True  # the gateway's own zone before the rest of its region
    spill: SpillParams = SpillParams()  # out of the region when it is saturated
    recovery: RecoveryParams = RecoveryParams()  # back into it after it was down
    standby_at: float = 0.25  # the spill share at which the region's standbys join

    def __post_init__(self) -> None:
        within("standby_at", self.standby_at, 0, 1)


class Locality:
    """The filter (module docstring). In a pool larger than the shortlist it also names the
    nearest tier's backends (`nominate`: a sample of them, from the whole pool it is told of),
    so a shortlist holds some whenever the pool has any, and the tier kept is the pool's
    nearest, not the sample's. Its router tells it where the pool's candidates are (`watch`):
    the region's state is judged on them, not on the part of them one pick is given."""

    name = "locality"

    def __init__(
        self, params: LocalityParams, here: Place, rng: random.Random, loads: CandidateLoads
    ) -> None:
        self.here = here
        self._zone = here.zone if params.prefer_zone else None
        self._region = here.region
        self._rng = rng
        self._loads = loads
        self.local = LocalRegion(params.spill, params.recovery, params.standby_at)
        self._members: Callable[[], Sequence[BackendState]] | None = None
        self._pool: Callable[[], Sequence[BackendState]] | None = None  # its candidates
        self._pool_seen: Sequence[BackendState] = ()  # as they were when last judged
        self._near: list[str] = []  # the ids of the whole pool's nearest tier
        # The last candidates filtered, what was kept of them and where the share that leaves
        # goes, until when that holds (the same lists while the pool's are the same: pickers
        # index a list by its identity); the region's state is judged again then too, so a
        # region whose last backend left is down at the next pick.
        self._seen: Sequence[BackendState] = ()
        self._kept: Tier = ()
        self._out: Tier = ()
        self._keep = 1.0
        self._until = -math.inf

    def watch(
        self,
        members: Callable[[], Sequence[BackendState]],
        candidates: Callable[[], Sequence[BackendState]],
    ) -> None:
        self._members, self._pool = members, candidates

    def roster(self, candidates: Sequence[BackendState]) -> None:
        self._near = [s.backend.id for s in self._tiers(candidates)[0]]

    def nominate(self, request: RoutingRequest, now: float) -> list[str]:
        near = self._near
        return near if len(near) <= NOMINEES else self._rng.sample(near, NOMINEES)

    def filter(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> Sequence[BackendState]:
        if self._health_changed(candidates) or now >= self._until:
            self._until = now + RECHECK_S
            self._judge(candidates, now)
            self._seen = ()  # the tiers follow what was judged
        if candidates is not self._seen:
            self._seen = candidates
            self._kept, self._out = self._tiers(candidates)
        keep = self._keep
        if keep < 1.0 and self._out and not request.stays and self._rng.random() >= keep:
            self.local.spilled += 1
            return self._out
        return self._kept

    def _health_changed(self, candidates: Sequence[BackendState]) -> bool:
        """Whether a member's health changed since the last judgement: the pool's candidates
        are a new tuple (until told of the pool, these candidates are new). One identity test
        a pick, not a scan: a shortlist is a new list every pick."""
        if self._pool is None:
            return candidates is not self._seen
        now_ = self._pool()
        changed = now_ is not self._pool_seen
        self._pool_seen = now_
        return changed

    def _judge(self, candidates: Sequence[BackendState], now: float) -> None:
        """The region's state, from the health of the pool's members (these candidates, until
        told of the pool): a member at its max_in_flight or backing off is busy, not down."""
        members = candidates if self._members is None else self._members()
        local = [s for s in members if self._is_local(s) and not s.flags]
        serving = _serving(local, self.local.standbys)
        self.local.update(len(local), self._wait(serving), now)
        self._keep = self.local.keep

    def _wait(self, serving: Sequence[BackendState]) -> float:
        """The least predicted wait before a new request's prefill starts among `serving`:
        prompt tokens sent there and not yet prefilled x seconds per prefilled token."""
        waits = [
            load.pending_prefill * (state.latency.prefill_s_per_token or 0.0)
            for state, load in self._loads.of(serving)
        ]
        return min(waits, default=0.0)

    def _is_local(self, state: BackendState) -> bool:
        return self._region is None or state.backend.labels.get(REGION) == self._region

    def _tiers(self, candidates: Sequence[BackendState]) -> tuple[Tier, Tier]:
        """The nearest tier with candidates, and the next (where a share that leaves goes)."""
        local = [s for s in candidates if self._is_local(s)]
        near = _serving(local, self.local.standbys)
        zone = self._zone
        if zone is not None:
            near = [s for s in near if s.backend.labels.get(ZONE) == zone] or near
        if self._region is None:
            return (near or candidates), ()
        away = _nearest_region([s for s in candidates if not self._is_local(s)], self._rng)
        if not near or self.local.phase is Phase.DOWN:
            return (away or near or candidates), ()
        return near, away


def _serving(states: Sequence[BackendState], standbys: bool) -> Tier:
    """Of one region's backends, those that serve now: its primaries (and its standbys when
    `standbys`), or its standbys when no primary is left."""
    if standbys:
        return states
    primaries = [s for s in states if s.backend.labels.get(STANDBY) != "true"]
    return primaries or states


def _nearest_region(candidates: Sequence[BackendState], rng: random.Random) -> Tier:
    """The serving backends of the nearest region: the least probe round trip, else the least
    TTFT (unlabelled ones last; among regions never measured, one drawn at random)."""
    by_region: dict[str | None, list[BackendState]] = {}
    for state in candidates:
        by_region.setdefault(state.backend.labels.get(REGION), []).append(state)

    def distance(region: str | None) -> tuple[bool, float, float, float]:
        states = by_region[region]
        rtts = [s.latency.rtt_s for s in states if s.latency.rtt_s is not None]
        ttfts = [s.latency.ttft_s for s in states if s.latency.ttft_s is not None]
        nearest = min(rtts, default=math.inf)
        return region is None, nearest, min(ttfts, default=math.inf), rng.random()

    return _serving(by_region[min(by_region, key=distance)], False) if by_region else ()
