"""Who is in each pool while the gateway runs: the operator's changes (gateway/admin.py).

    add       a backend joins a pool, probed and scraped on the pool's `health_check` and
              `engine_metrics` like the backends configured at start (health/probes.py):
              routable at once (the operator's), or (`probe_first`, discovery's) only once
              a probe has passed, ramping up over the pool's slow start from its joining
    remove    it is GONE at once (nothing new is routed to it, panic or not); it leaves the
              pool when its last request in flight ends, and its probes stop then
    drain     it finishes what it has and takes nothing new, until undrained
    weight    its configured weight is replaced; its effective weight follows (fleet/pool.py)
    region    every member of a region drains (and those that join it), or stops draining

A backend is found by its id (host:port and base path, fleet/backend.py `backend_id`), in every
pool it serves, as a drain finds it. A reloaded config (fleetgate/reload.py) hands over its
pools (`adopt`) and joins the backends it adds (`join`) at a slow start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fleetgate.fleet.backend import REGION, Backend, BackendState, backend_id
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.pool import Pool


class NotMember(LookupError):
    """No pool of that model, or no backend of that id."""


class AlreadyMember(ValueError):
    """The pool has a backend of that id already (`leaving`: removed, requests in flight)."""

    def __init__(self, message: str, leaving: bool) -> None:
        super().__init__(message)
        self.leaving = leaving


class Watcher(Protocol):
    """What watches backends from outside (health/probes.py: health checks, scrapes)."""

    def probes(self, pool: Pool) -> bool:
        """Whether a backend joining `pool` is probed (only then may it wait for a probe)."""
        ...

    def watch(self, pool: Pool, state: BackendState) -> None: ...

    def forget(self, state: BackendState) -> None: ...


@dataclass(frozen=True, slots=True)
class Joining:
    """A backend to add to a pool (what the admin API's request says of it)."""

    url: str
    weight: float = 1.0
    labels: Mapping[str, str] = field(default_factory=dict)
    max_in_flight: int | None = None
    api_key: str | None = None
    cost_per_hour_usd: float = 0.0
    engine: str = "auto"


class Membership:
    """Adds and removes the backends of `pools` (by model); `watcher` (None: nothing watches,
    as in a benchmark) starts watching each that joins and stops for each that leaves."""

    def __init__(
        self,
        pools: Mapping[str, Pool],
        clock: Callable[[], float],
        watcher: Watcher | None = None,
        others: Sequence[Pool] = (),
    ) -> None:
        self._clock = clock
        self._watcher = watcher
        # A new backend's place in its pool's names ("model#3"): never one used before.
        self._places: dict[str, int] = {}
        self._pools: Mapping[str, Pool] = {}
        self._others: tuple[Pool, ...] = ()
        self.drained_regions: set[str] = set()  # the operator's (a drill): joiners drain too
        self.adopt(pools, others)

    def adopt(self, pools: Mapping[str, Pool], others: Sequence[Pool] = ()) -> None:
        """From now on the pools are `pools` (a reloaded config's: those kept, those new) and
        `others` (prefill pools: no backend joins them here, but a drill reaches them); the
        drained regions are applied to their members (new ones, or relabelled)."""
        self._pools, self._others = pools, tuple(others)
        for model, pool in pools.items():
            self._places.setdefault(model, len(pool.states))
            if self._watcher is not None:
                pool.left = self._watcher.forget
        if self.drained_regions:
            self._apply_regions()

    def find(self, backend: str, model: str | None = None) -> list[tuple[Pool, BackendState]]:
        """Every pool's member of id `backend` (empty when none has one); only the pool of
        `model`'s, when given."""
        return [
            (pool, state)
            for pool in self._pools.values()
            if model is None or pool.model == model
            for state in pool.states
            if state.backend.id == backend
        ]

    def member(self, model: str, backend: str) -> BackendState | None:
        """The pool of `model`'s member of id `backend`, if it has one: O(1)."""
        pool = self._pools.get(model)
        return None if pool is None else pool.members.get(backend)

    def add(self, model: str, joining: Joining, *, probe_first: bool = False) -> BackendState:
        """`joining` as a new member of the pool of `model`; NotMember when there is no such
        pool, AlreadyMember when it has a backend of that id (ValueError for a bad URL).
        `probe_first`: nothing is routed to it until a health probe has passed (at once
        when the pool probes none), and it ramps up over the pool's slow start."""
        pool = self._pools.get(model)
        if pool is None:
            known = ", ".join(sorted(self._pools))
            raise NotMember(f"no pool serves {model!r}; pools: {known}")
        identity = backend_id(joining.url)
        for state in pool.states:
            if state.backend.id == identity:
                leaving = pool.retiring(state)
                why = " (leaving: its last requests are in flight)" if leaving else ""
                message = f"the pool {model!r} has the backend {identity!r} already{why}"
                raise AlreadyMember(message, leaving)
        backend = Backend(
            id=identity,
            url=joining.url,
            models=(model,),
            weight=joining.weight,
            labels=dict(joining.labels),
            max_in_flight=joining.max_in_flight,
            api_key=joining.api_key,
            name=self.new_name(model),
            cost_per_hour_usd=joining.cost_per_hour_usd,
            engine=joining.engine,
        )
        return self.join(pool, backend, probe_first=probe_first)

    def new_name(self, model: str) -> str:
        """A name for a backend joining the pool of `model` ("model#3"): never one used before."""
        place = self._places[model]
        self._places[model] = place + 1
        return f"{model}#{place}"

    def join(
        self, pool: Pool, backend: Backend, *, probe_first: bool, slow_start: bool = False
    ) -> BackendState:
        """`backend`, named already, as a new member of `pool` (one of these pools, without a
        member of its id), watched; `probe_first` as `add` says; `slow_start`: routable at
        once, ramping up over the pool's slow start (a reloaded config's new backend)."""
        state = BackendState(backend)
        now = self._clock()
        if backend.labels.get(REGION) in self.drained_regions:
            state.flags |= HealthFlag.REGION_DRAINED
        if slow_start:
            state.ramp_from = now
        elif probe_first:  # its slow start begins with its first good probe (health/active.py)
            if self._watcher is not None and self._watcher.probes(pool):
                state.flags |= HealthFlag.UNPROBED
            else:  # nothing will probe it: at once
                state.ramp_from = now
        pool.add(state, now)
        if self._watcher is not None:
            self._watcher.watch(pool, state)
        return state

    def remove(self, backend: str, model: str | None = None) -> list[tuple[Pool, BackendState]]:
        """Retire every member of id `backend` (of the pool of `model`'s alone, when given:
        fleet/pool.py `retire`); those that still have requests in flight stay in their pool
        until the last ends. NotMember when none is a member."""
        found = self.find(backend, model)
        if not found:
            raise NotMember(f"no backend {backend!r}")
        now = self._clock()
        for pool, state in found:
            pool.retire(state, now)
        return found

    def drain(
        self, backend: str, draining: bool, model: str | None = None
    ) -> list[tuple[Pool, BackendState]]:
        """Drain every member of id `backend` (of the pool of `model`'s alone, when given), or
        end its draining; NotMember when none is a member."""
        found = self.find(backend, model)
        if not found:
            raise NotMember(f"no backend {backend!r}")
        now = self._clock()
        for pool, state in found:
            if draining:
                state.flags |= HealthFlag.DRAINING
            else:
                state.flags &= ~HealthFlag.DRAINING
            pool.refresh(now)
        return found

    def drain_region(self, region: str, draining: bool) -> list[tuple[Pool, BackendState]]:
        """Drain every member whose `region` label is `region` (prefill pools' too), and those
        that join it later (a drill, or a region taken out of service), or end that; the
        members of it. Its own flag: a backend drained alone, or by discovery while not
        ready, stays so."""
        if draining:
            self.drained_regions.add(region)
        else:
            self.drained_regions.discard(region)
        return self._apply_regions(region)

    def _apply_regions(self, region: str | None = None) -> list[tuple[Pool, BackendState]]:
        """Flag REGION_DRAINED on exactly the members of the drained regions (of `region`'s
        alone, when given); the members looked at."""
        now = self._clock()
        found = []
        for pool in (*self._pools.values(), *self._others):
            changed = False
            for state in pool.states:
                where = state.backend.labels.get(REGION)
                if region is not None and where != region:
                    continue
                found.append((pool, state))
                flags = state.flags
                if where in self.drained_regions:
                    state.flags |= HealthFlag.REGION_DRAINED
                else:
                    state.flags &= ~HealthFlag.REGION_DRAINED
                changed = changed or flags != state.flags
            if changed:
                pool.refresh(now)
        return found

    def set_weight(
        self, backend: str, weight: float, model: str | None = None
    ) -> list[tuple[Pool, BackendState]]:
        """Give every member of id `backend` (of the pool of `model`'s alone, when given) this
        configured weight (> 0); NotMember when none is a member."""
        found = self.find(backend, model)
        if not found:
            raise NotMember(f"no backend {backend!r}")
        now = self._clock()
        for pool, state in found:
            pool.set_weight(state, weight, now)
        return found
