"""How much of its own traffic the gateway's region keeps: spillover when it is saturated,
failover when it is down, and the gradual return after. The `locality` filter
(routing/locality.py) asks it once a second (and whenever the pool's members change) and,
between, draws each request against the share it gave.

Spillover. The region's wait is the shortest predicted wait of its backends before a new
request's prefill starts: prompt tokens already sent and not yet prefilled x the backend's
measured seconds per prefilled token (fleet/latency.py). Past `spill.after_s` the region is
saturated and the share of requests sent to the next region grows, faster the larger the
overload (`rate` per second at twice the wait); below `calm` x `after_s` it shrinks, slowly
(`fall` per second); in between it holds. So the share settles where the region's wait sits
within the band, and a wait that dips for a moment does not bring the whole spill back: no
flapping. A request whose tenant opted out (`tenants[].spill: false`) stays.

Failover. The region is down while none of its backends (standbys included) is a candidate:
the health detectors took them all out (refused connections, failed probes, outliers, a
drill). Every request then goes to the next region. When some return, the region holds
(`recovery.hold_s`: their probes must keep passing, or it is down again) and then takes its
traffic back over `recovery.shift_s`, a linearly growing share, so the returning backends
are not flooded.

Warm standbys. Backends labelled `standby: "true"` take no traffic while their region's
primaries serve it. They join their region's tier when the primaries are all down, or, in
the gateway's own region, once the spill share reaches `standby_at` (the region is saturated
past that), and leave again only after the spill has been back to 0 for `recovery.hold_s`.
They are members like the others, so the active health checks probe them all the time.
"""

from __future__ import annotations

import math
from enum import Enum

from fleetgate.settings import Settings, at_least, positive_seconds, within


class SpillParams(Settings, frozen=True):
    """Spillover out of the gateway's region when it is saturated."""

    enabled: bool = True
    after_s: float = 1.0  # a predicted wait past this saturates the region
    rate: float = 0.5  # the spill share grows this much a second at twice `after_s`
    fall: float = 0.05  # it shrinks this much a second once the wait is below the calm
    calm: float = 0.5  # of `after_s`: below it the share shrinks; between, it holds

    def __post_init__(self) -> None:
        positive_seconds("spill.after_s", self.after_s)
        within("spill.rate", self.rate, 0, 10, open_low=True)
        within("spill.fall", self.fall, 0, 10, open_low=True)
        within("spill.calm", self.calm, 0, 1)


class RecoveryParams(Settings, frozen=True):
    """A region's return after it was down."""

    hold_s: float = 10.0  # its returning backends must stay up this long first
    shift_s: float = 30.0  # then its traffic comes back over this long

    def __post_init__(self) -> None:
        at_least("recovery.hold_s", self.hold_s, 0)
        at_least("recovery.shift_s", self.shift_s, 0)


class Phase(Enum):
    """Where the gateway's region stands."""

    UP = "up"  # serving its traffic (less what spills)
    DOWN = "down"  # no backend of it can serve: its traffic goes to the next region
    HOLDING = "holding"  # back, proving itself for `hold_s`: still none of its traffic
    RETURNING = "returning"  # taking its traffic back, a growing share over `shift_s`


class LocalRegion:
    """The gateway's region's share of its own traffic (module docstring). `update` is told,
    now and then, how many of its backends are candidates and its predicted wait;
    `keep` is then the share of requests that stay in it, `standbys` whether its standbys
    serve. Counts what the metrics report: failovers, how long the last took, spills."""

    def __init__(
        self, spill: SpillParams, recovery: RecoveryParams, standby_at: float = 0.25
    ) -> None:
        self._spill = spill
        self._recovery = recovery
        self._standby_at = standby_at
        self.phase = Phase.UP
        self.spill = 0.0  # the share sent out for saturation
        self.keep = 1.0  # the share of requests that stay: (1 - spill) x what recovery allows
        self.standbys = False
        self.failovers = 0
        self.last_failover_s = 0.0  # from the first backend lost to the region down
        self.spilled = 0  # requests sent out for saturation or recovery (the filter counts)
        self._since = 0.0  # when the phase began
        self._last = math.nan  # the last update's time
        self._whole = 0  # its most candidates since it was last whole or down
        self._losing_since: float | None = None  # when it last fell below that
        self._calm_since: float | None = 0.0  # since when nothing spilled (None: spilling)

    def update(self, backends: int, wait_s: float, now: float) -> None:
        """Advance to `now`: `backends` of it are candidates (standbys included), and a new
        request would wait `wait_s` before its prefill (its least loaded serving backend's)."""
        dt = 0.0 if math.isnan(self._last) else max(0.0, now - self._last)
        self._last = now
        self._track_losses(backends, now)
        self._advance_phase(backends, now)
        self._adjust_spill(wait_s, dt, now)
        self.keep = (1.0 - self.spill) * self._recovered(now)

    def _track_losses(self, backends: int, now: float) -> None:
        if backends >= self._whole:
            self._whole, self._losing_since = backends, None
        elif self._losing_since is None:
            self._losing_since = now

    def _advance_phase(self, backends: int, now: float) -> None:
        phase = self.phase
        if backends == 0:
            if phase is not Phase.DOWN:
                self._enter(Phase.DOWN, now)
                if phase is not Phase.HOLDING:  # a relapse is not a second failover
                    self.failovers += 1
                    since = self._losing_since if self._losing_since is not None else now
                    self.last_failover_s = now - since
                self._whole, self._losing_since = 0, None
        elif phase is Phase.DOWN:
            self._enter(Phase.HOLDING, now)
        elif phase is Phase.HOLDING and now - self._since >= self._recovery.hold_s:
            self._enter(Phase.RETURNING, now)
        elif phase is Phase.RETURNING and self._recovered(now) >= 1.0:
            self._enter(Phase.UP, now)

    def _enter(self, phase: Phase, now: float) -> None:
        self.phase, self._since = phase, now

    def _recovered(self, now: float) -> float:
        """The share of its traffic recovery gives it back by now."""
        if self.phase is Phase.UP:
            return 1.0
        if self.phase is not Phase.RETURNING:
            return 0.0
        shift = self._recovery.shift_s
        return 1.0 if shift <= 0 else min(1.0, (now - self._since) / shift)

    def _adjust_spill(self, wait_s: float, dt: float, now: float) -> None:
        spill = self._spill
        if not spill.enabled:
            return
        overload = wait_s / spill.after_s
        if overload > 1.0:
            self.spill = min(1.0, self.spill + spill.rate * min(overload - 1.0, 2.0) * dt)
        elif overload < spill.calm:
            self.spill = max(0.0, self.spill - spill.fall * dt)
        if self.spill >= self._standby_at:
            self.standbys = True
        if self.spill > 0.0:
            self._calm_since = None
        elif self._calm_since is None:
            self._calm_since = now
        elif self.standbys and now - self._calm_since >= self._recovery.hold_s:
            self.standbys = False
