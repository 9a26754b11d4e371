"""A pool: the backends that serve one model (the host set), and its health verdict.

What routes over it is routing/router.py's; what is counted on it comes from the request
lifecycle's events (lifecycle/accounting.py); the detectors (health/) set its backends' flags
and eject them through it. Its members change while it runs only through `add` and `retire`
(fleet/membership.py: the operator's admin API, discovery, a reloaded config), and a reloaded
config changes its settings (`configure`) and its members' (`reconfigure`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.calibration import WeightSettings, speed_factors
from fleetgate.fleet.health import NEVER_ROUTE, HealthFlag, HealthSettings
from fleetgate.fleet.load_board import BackendLoad, LoadBoard, MemoryLoadBoard

SLOW_START_FLOOR = 0.1  # a returning backend starts at this share of its weight
SLOW_START_STEPS = 10  # its weight is raised this many times over the window


def _ignore(state: BackendState) -> None:
    """The `left` listener while none is set."""


def _ignore_count(members: int) -> None:
    """The `resized` listener while none is set."""


class Pool:
    """Backends of one model: who is routable now, and the board of their in-flight counts
    that policies read (fleet/load_board.py; its own in this process unless given one).

    `candidates` is a tuple rebuilt only when health changes, so policies can keep indexes
    keyed on its identity. Time-driven changes (an ejection ending, a backoff expiring, a slow
    start stepping up, a calibration) are applied lazily by `update`, which whoever reads the
    candidates calls once `now >= next_check`.
    """

    __slots__ = (
        "_ejected", "_full", "_health", "_limits", "_next_calibration", "_retiring", "_weights",
        "board", "candidates", "in_flight", "left", "load_changed", "members", "model",
        "next_check", "resized", "states",
    )  # fmt: skip

    def __init__(
        self,
        model: str,
        states: Sequence[BackendState],
        health: HealthSettings | None = None,
        weights: WeightSettings | None = None,
        board: LoadBoard | None = None,
    ) -> None:
        self.model = model
        self.in_flight = 0  # requests in flight to any backend of the pool
        self.states = tuple(states)
        # The members by id (unique in a pool): events name backends by id, and a subscriber
        # that needs the state finds it here. Read it; only the pool changes it.
        self.members: dict[str, BackendState] = {s.backend.id: s for s in self.states}
        # Some member has a max_in_flight (then begin and end look at its state).
        self._limits = any(s.backend.max_in_flight is not None for s in self.states)
        # Each backend's in-flight requests and tokens, by id: what routing reads of its load.
        self.board: LoadBoard = MemoryLoadBoard() if board is None else board
        self.board.watch(self._changed_elsewhere)  # other gateways' requests (a shared board)
        # Told whenever a backend's in-flight count or effective weight changed (a picker
        # that keeps an index over them sets it: routing/router.py). None: no one listens,
        # and begin and end make no call for it.
        self.load_changed: Callable[[BackendState], None] | None = None
        # Told when a retired backend has left the pool (its probes stop: fleet/membership.py).
        self.left: Callable[[BackendState], None] = _ignore
        # Told how many members it has after one joined or left (its concurrency limit
        # scales with them: traffic/concurrency.py).
        self.resized: Callable[[int], None] = _ignore_count
        self._retiring: set[BackendState] = set()  # GONE, waiting for their last requests
        self._health = health or HealthSettings()
        self._weights = weights or WeightSettings()
        self._next_calibration = self._weights.interval_s if self._weights.calibrate else math.inf
        self._ejected: dict[BackendState, float] = {}  # ejected backends: when each returns
        self.next_check = math.inf
        self._full: set[BackendState] = set()  # at their max_in_flight
        self.candidates: tuple[BackendState, ...] = ()
        self.refresh(0.0)

    def configure(self, health: HealthSettings, weights: WeightSettings, now: float) -> None:
        """A reloaded config's settings, from now on (its members and what they learned stay)."""
        if weights != self._weights:
            self._weights = weights
            self._next_calibration = now + weights.interval_s if weights.calibrate else math.inf
            if not weights.calibrate:  # its measured speeds no longer count
                for state in self.states:
                    state.speed = 1.0
                    self._reweigh(state, now)
        self._health = health
        self.refresh(now)

    def refresh(self, now: float) -> None:
        """Recompute the candidates after a health change.

        Candidates are the healthy backends below their concurrency limit and not backing off
        (if all are backing off, those below their limit). When fewer than the panic
        threshold's share is healthy, all backends not draining or gone count as healthy.
        """
        routable = [s for s in self.states if not s.flags & NEVER_ROUTE]
        healthy = [s for s in routable if not s.flags]
        if len(healthy) < self._health.panic_threshold * len(routable):
            healthy = routable  # panic: spread over all rather than crush the few
        open_ = [s for s in healthy if s not in self._full] if self._full else healthy
        available = [s for s in open_ if s.backoff_until <= now]
        candidates = tuple(available or open_)
        if candidates != self.candidates:  # same members: keep the tuple, and indexes on it
            self.candidates = candidates
        backoffs = [s.backoff_until for s in healthy if s.backoff_until > now]
        ramps = [now + self._health.slow_start_s / SLOW_START_STEPS] if self._ramping() else []
        returns = min(self._ejected.values(), default=math.inf)
        self.next_check = min([*backoffs, *ramps, returns, self._next_calibration])

    def _ramping(self) -> bool:
        return any(s.ramp_from is not None for s in self.states)

    @property
    def ready(self) -> bool:
        """Some backend is healthy (a pool in panic is not ready)."""
        return any(not s.flags for s in self.states)

    def update(self, now: float) -> None:
        """Apply what time has changed: ejections ended, slow starts, calibrated speeds."""
        for state in [s for s, until in self._ejected.items() if until <= now]:
            del self._ejected[state]
            state.flags &= ~HealthFlag.EJECTED
            state.ramp_from = now
        changed = [s for s in self.states if s.ramp_from is not None]
        if now >= self._next_calibration:
            self._next_calibration = now + self._weights.interval_s
            for state, factor in zip(
                self.states, speed_factors(self.states, self._weights), strict=True
            ):
                state.speed = factor
            changed = list(self.states)
        for state in changed:
            if self._ramp_share(state, now) == 1.0:
                state.ramp_from = None
            self._reweigh(state, now)
        self.refresh(now)

    def _ramp_share(self, state: BackendState, now: float) -> float:
        """Its slow-start share: max(floor, elapsed / window), raised in steps (by `update`)."""
        if state.ramp_from is None:
            return 1.0
        slow_start = self._health.slow_start_s
        progress = (now - state.ramp_from) / slow_start if slow_start > 0 else 1.0
        return 1.0 if progress >= 1.0 else max(SLOW_START_FLOOR, progress)

    def _reweigh(self, state: BackendState, now: float) -> None:
        """effective weight = configured x measured speed x slow-start share x throttle share"""
        weight = (
            state.backend.weight * state.speed * self._ramp_share(state, now)
            * state.throttle_share
        )  # fmt: skip
        if weight != state.weight:
            state.weight = weight
            if self.load_changed is not None:
                self.load_changed(state)

    # -- what the detectors decide ------------------------------------------------------------

    def eject(self, state: BackendState, now: float, until: float) -> None:
        """Take `state` out of routing until `until`; it then returns at a slow start."""
        self._ejected[state] = until
        state.flags |= HealthFlag.EJECTED
        self.refresh(now)

    @property
    def ejected(self) -> int:
        """How many backends are ejected now."""
        return len(self._ejected)

    def ejected_until(self, state: BackendState) -> float | None:
        """When an ejected backend returns (None: it is not ejected)."""
        return self._ejected.get(state)

    def is_ejected(self, state: BackendState) -> bool:
        """Ejected and not returned yet (a return is applied by the next `update`)."""
        return state in self._ejected

    def throttle(self, state: BackendState, share: float, now: float) -> None:
        """Its GPUs throttle (health/gpu.py): routed at `share` of its weight (1: they do not
        any more). Still a candidate: slower is not broken."""
        if share != state.throttle_share:
            state.throttle_share = share
            self._reweigh(state, now)

    def backpressure(self, state: BackendState, now: float, retry_after_s: float) -> None:
        """The engine asked for no traffic for a while: not a failure, just skip it."""
        state.backoff_until = max(state.backoff_until, now + retry_after_s)
        self.refresh(now)

    # -- who is in the pool (fleet/membership.py) -----------------------------------------------

    def add(self, state: BackendState, now: float) -> None:
        """A new backend, routable at once unless flagged (its checks may take it out later, as
        at start), at a slow start when its `ramp_from` is set.
        A backend that left comes back as a new state (fleet/membership.py): its record on
        the board went with the old one."""
        self.states = (*self.states, state)
        self.members[state.backend.id] = state
        self._limits = self._limits or state.backend.max_in_flight is not None
        if state.ramp_from is not None:  # joining at a slow start: from its first share
            self._reweigh(state, now)
        self.refresh(now)
        self.resized(len(self.states))

    def rejoin(self, state: BackendState, now: float) -> None:
        """A retired member still draining is wanted again (a reloaded config lists it): it
        stays, routable as before its retirement."""
        self._retiring.discard(state)
        state.flags &= ~HealthFlag.GONE
        self.refresh(now)

    def loads(self) -> list[tuple[BackendState, BackendLoad]]:
        """Each member and its record on the board (for metrics, the dashboard, the admin API)."""
        load = self.board.load
        return [(s, load(s.backend.id)) for s in self.states]

    def retire(self, state: BackendState, now: float) -> bool:
        """Take `state` out for good: GONE at once (nothing new is routed to it, panic or
        not), dropped from `states` when its last request in flight ends (`end`), which
        `left` is told. True when it had nothing in flight and has left already."""
        state.flags |= HealthFlag.GONE
        self._retiring.add(state)
        self.refresh(now)
        if self.board.own(state.backend.id).in_flight == 0:  # other gateways' are theirs
            self._leave(state, now)
            return True
        return False

    def retiring(self, state: BackendState) -> bool:
        """Retired, with requests still in flight."""
        return state in self._retiring

    def _leave(self, state: BackendState, now: float) -> None:
        self._retiring.discard(state)
        self._ejected.pop(state, None)
        self._full.discard(state)
        self.states = tuple(s for s in self.states if s is not state)
        del self.members[state.backend.id]
        self.board.forget(state.backend.id)
        self.refresh(now)
        self.left(state)
        self.resized(len(self.states))

    def set_weight(self, state: BackendState, weight: float, now: float) -> None:
        """The operator's new configured weight for `state` (> 0): its effective weight keeps
        its measured speed and slow-start share, x weight / the old configured weight."""
        self.reconfigure(state, replace(state.backend, weight=weight), now)

    def reconfigure(self, state: BackendState, backend: Backend, now: float) -> None:
        """`state`'s backend as a reloaded config describes it (same id): what was measured of
        it stays; its effective weight follows a new configured weight as `set_weight` says."""
        old = state.backend.weight
        state.backend = backend
        self._limits = any(s.backend.max_in_flight is not None for s in self.states)
        self._full.discard(state)  # as its limit says now (one removed: never full)
        self._count_full(state, self.board.load(backend.id).in_flight, now)
        effective = state.weight * backend.weight / old
        if effective != state.weight:
            state.weight = effective
            if self.load_changed is not None:
                self.load_changed(state)
        self.refresh(now)

    # -- what the lifecycle counts (lifecycle/accounting.py) ----------------------------------
    # (A first token changes nothing here: the accounting tells the board alone.)

    def begin(self, backend_id: str, now: float, prompt_tokens: int = 0) -> None:
        """A request with this many prompt tokens (estimated) was sent to the backend of that
        id (a member when it was picked; it may have left since, as a hedge's may)."""
        load = self.board.begin(backend_id, prompt_tokens)
        self.in_flight += 1
        if self.load_changed is None and not self._limits:
            return  # nothing here needs its state: the common case, at no lookup
        state = self.members.get(backend_id)
        if state is None:
            return
        if self.load_changed is not None:
            self.load_changed(state)
        self._count_full(state, load.in_flight, now)

    def end(
        self, backend_id: str, now: float, prompt_tokens: int = 0, unprefilled: int = 0
    ) -> None:
        """A request to the backend of that id finished, whatever its outcome; `prompt_tokens`
        as given to `begin`, `unprefilled` those of them the board's `prefilled` has not
        released."""
        load = self.board.end(backend_id, prompt_tokens, unprefilled)
        self.in_flight -= 1
        if self.load_changed is None and not self._limits and not self._retiring:
            return  # nothing here needs its state: the common case, at no lookup
        state = self.members.get(backend_id)
        if state is None:
            return
        if self.load_changed is not None:
            self.load_changed(state)
        self._count_full(state, load.in_flight, now)
        # Other gateways' requests to it are theirs to finish: it waits for this one's alone.
        if self._retiring and state in self._retiring and not self.board.own(backend_id).in_flight:
            self._leave(state, now)

    def _changed_elsewhere(self, backend_id: str, now: float) -> None:
        """Other gateways' requests changed the backend's record (a shared board's sync)."""
        state = self.members.get(backend_id)
        if state is None:
            return
        if self.load_changed is not None:
            self.load_changed(state)
        self._count_full(state, self.board.load(backend_id).in_flight, now)

    def _count_full(self, state: BackendState, in_flight: int, now: float) -> None:
        """`state` is at its max_in_flight or not, as `in_flight` says: the candidates are
        made again when that changed."""
        limit = state.backend.max_in_flight
        if limit is None or (in_flight >= limit) == (state in self._full):
            return
        if in_flight >= limit:
            self._full.add(state)
        else:
            self._full.discard(state)
        self.refresh(now)
