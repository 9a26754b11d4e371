"""GPU health from the agents beside the engines (`fleetgate worker gpu-agent`): their readings,
pushed with heartbeats, judged against the pool's `gpu:` thresholds.

    hard fault (unhealthy: GPU_FAULT, out of routing like a failed health check)
        an XID critical error not in `ignored_xids` (with `unhealthy_on_xid`), more volatile
        uncorrected ECC errors than `max_ecc_uncorrected`, a GPU hotter than
        `max_temperature_c`, or a GPU NVML calls lost
    throttling (degraded: still routed, at weight x `throttled_weight`)
        a GPU whose clocks are held down for a reason in `degrade_on_throttle`

Any one GPU of a backend is enough. A fault holds until the readings have been free of faults
for `clean_for_s` (an XID is reported once, so that is how long after the last one); the
throttle holds while the latest reading throttles. Readings older than `stale_after_s` judge
nothing: an agent that stopped pushing cannot keep a backend out of routing, or at a lower
weight, for good. Its verdict is dropped (the backend `stale`, judged by its other detectors
again: that the engine answers is for the pool's health check to say) when the board's
periodic `expire` finds them too old, not when they are next read, so that the backend returns
with no new reading and routing never checks ages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import msgspec

from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.gpu import (
    THROTTLE_REASONS,
    GpuReading,
    GpuState,
    GpuStatus,
    ThrottleReason,
)
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.pool import Pool
from fleetgate.lifecycle.events import GpuChanged
from fleetgate.settings import Settings, at_least, positive_seconds, within

# XIDs an application's own fault causes (a kernel's bad address, a timeout), not the GPU's:
# the NVIDIA Kubernetes device plugin skips the same ones by default.
APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)


class GpuSettings(Settings, frozen=True):
    """A pool's `gpu:` section."""

    enabled: bool = False  # take GPU readings from agents beside this pool's engines
    max_temperature_c: float | None = 90.0  # a GPU hotter than this: unhealthy; null: no limit
    max_ecc_uncorrected: int | None = 0  # more volatile uncorrected ECC errors: unhealthy
    unhealthy_on_xid: bool = True  # an XID critical error makes the backend unhealthy
    ignored_xids: tuple[int, ...] = APPLICATION_XIDS  # ...except these
    # Throttle reasons that lower a backend's weight (sw_power_cap is left out: a GPU at full
    # load sits at its power limit, which is normal, not a fault).
    degrade_on_throttle: tuple[ThrottleReason, ...] = (
        "hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake",
    )  # fmt: skip
    throttled_weight: float = 0.5  # a throttling backend's weight is multiplied by this
    clean_for_s: float = 30.0  # fault-free readings this long before an unhealthy one returns
    # Readings older than this judge nothing (the backend is `stale`): three of the agent's
    # pushes (its --interval, 5 s by default), so that one or two lost ones do not count.
    stale_after_s: float = 15.0

    def __post_init__(self) -> None:
        within("throttled_weight", self.throttled_weight, 0, 1, open_low=True)
        at_least("clean_for_s", self.clean_for_s, 0)
        positive_seconds("stale_after_s", self.stale_after_s)
        if self.max_ecc_uncorrected is not None:
            at_least("max_ecc_uncorrected", self.max_ecc_uncorrected, 0)
        if self.max_temperature_c is not None:
            within("max_temperature_c", self.max_temperature_c, 0, 200)
        for name in self.degrade_on_throttle:
            if name not in THROTTLE_REASONS:  # msgspec checks it when decoded; code too
                raise ValueError(f"`degrade_on_throttle`: no reason {name!r}")


@dataclass(frozen=True, slots=True)
class Judgement:
    faults: tuple[str, ...]  # what makes the backend unhealthy, one line each
    throttling: tuple[str, ...]  # what lowers its weight


def judge(readings: Iterable[GpuReading], s: GpuSettings) -> Judgement:
    """What a backend's readings say under the thresholds `s` (the module's docstring)."""
    faults: list[str] = []
    throttling: list[str] = []
    for r in readings:
        gpu = f"gpu {r.index}"
        if r.lost:
            faults.append(f"{gpu}: lost")
            continue
        if s.unhealthy_on_xid and r.xid_errors:
            faults += [f"{gpu}: xid {x}" for x in r.xid_errors if x not in s.ignored_xids]
        limit = s.max_ecc_uncorrected
        if limit is not None and r.ecc_uncorrected is not None and r.ecc_uncorrected > limit:
            faults.append(f"{gpu}: {r.ecc_uncorrected} uncorrected ECC errors (max {limit})")
        hottest = s.max_temperature_c
        if hottest is not None and r.temperature_c is not None and r.temperature_c > hottest:
            faults.append(f"{gpu}: {r.temperature_c} C (max {hottest:g})")
        throttling += [f"{gpu}: {why}" for why in r.throttle_reasons or ()
                       if why in s.degrade_on_throttle]  # fmt: skip
    return Judgement(tuple(faults), tuple(throttling))


class _Record:
    __slots__ = ("clean_since", "expired")

    def __init__(self) -> None:
        self.clean_since: float | None = None  # faulted, and fault-free readings since then
        self.expired = 0  # times its readings grew older than `stale_after_s`


class GpuWatch:
    """Applies one pool's backends' readings to them, through the pool (its flags and
    weights), on the pool's `gpu:` settings."""

    def __init__(self, settings: GpuSettings, pool: Pool) -> None:
        self._settings = settings
        self._pool = pool
        self._records: dict[BackendState, _Record] = {}

    @property
    def pool(self) -> Pool:
        return self._pool

    @property
    def settings(self) -> GpuSettings:
        return self._settings

    def record(
        self, state: BackendState, readings: Sequence[GpuReading], now: float
    ) -> GpuChanged | None:
        """Judge `state`'s new readings; the change of its GPU state, when there is one."""
        s, pool = self._settings, self._pool
        verdict = judge(readings, s)
        record = self._records.get(state)
        if record is None:
            if len(self._records) >= len(pool.states):  # forget backends that left the pool
                members = set(pool.states)
                self._records = {m: r for m, r in self._records.items() if m in members}
            record = self._records[state] = _Record()
        last = state.gpus
        totals = {} if last is None else dict(last.xid_totals)
        for r in readings:
            if r.xid_errors:
                totals[r.index] = totals.get(r.index, 0) + len(r.xid_errors)
        pool.throttle(state, s.throttled_weight if verdict.throttling else 1.0, now)
        faulted = bool(state.flags & HealthFlag.GPU_FAULT)
        if verdict.faults:
            record.clean_since = None
            if not faulted:
                state.flags |= HealthFlag.GPU_FAULT
                pool.refresh(now)
        elif faulted:
            if record.clean_since is None:
                record.clean_since = now
            if now - record.clean_since >= s.clean_for_s:
                record.clean_since = None
                state.flags &= ~HealthFlag.GPU_FAULT
                pool.refresh(now)
        new: GpuState = "ok"
        reasons = verdict.throttling
        if state.flags & HealthFlag.GPU_FAULT:
            new, reasons = "fault", verdict.faults or reasons
        elif verdict.throttling:
            new = "throttled"
        state.gpus = GpuStatus(
            at=now, state=new, readings=tuple(readings), faults=verdict.faults,
            throttling=verdict.throttling, xid_totals=totals,
        )  # fmt: skip
        if new == ("ok" if last is None else last.state):
            return None
        return GpuChanged(b"", now, pool.model, state.backend.id, new, reasons)

    def expire(self, now: float) -> list[GpuChanged]:
        """Drop the verdict of each backend whose readings are older than `stale_after_s`:
        GPU_FAULT cleared, its full weight back; the readings stay, `stale`, for the operator
        to see. Their changes, one per backend that went stale."""
        s, pool = self._settings, self._pool
        changes = []
        for state in pool.states:
            gpus = state.gpus
            if gpus is None or gpus.state == "stale" or now - gpus.at < s.stale_after_s:
                continue
            record = self._records.setdefault(state, _Record())
            record.expired += 1
            record.clean_since = None  # a fault seen again starts its clean time anew
            state.gpus = msgspec.structs.replace(gpus, state="stale")
            pool.throttle(state, 1.0, now)
            if state.flags & HealthFlag.GPU_FAULT:
                state.flags &= ~HealthFlag.GPU_FAULT
                pool.refresh(now)
            reason = f"no readings for {now - gpus.at:.1f} s"
            changes.append(GpuChanged(b"", now, pool.model, state.backend.id, "stale", (reason,)))
        return changes

    def expiries(self) -> Iterator[tuple[BackendState, int]]:
        """Each backend of the pool, and how many times its readings expired (0 until then,
        and for one that never sent any)."""
        for state in self._pool.states:
            record = self._records.get(state)
            yield state, 0 if record is None else record.expired


class GpuBoard:
    """Every pool's GpuWatch, found by backend id: where the heartbeat endpoint hands the
    readings it is sent. `on_change` hears each GpuChanged (the edge's emitter)."""

    def __init__(
        self,
        clock: Callable[[], float],
        on_change: Callable[[GpuChanged], None] | None = None,
    ) -> None:
        self._clock = clock
        self._watches: list[GpuWatch] = []
        self.on_change = on_change

    def watch(self, watch: GpuWatch) -> None:
        self._watches.append(watch)

    @property
    def watching(self) -> bool:
        return bool(self._watches)

    def _members(self, backend: str) -> list[tuple[GpuWatch, BackendState]]:
        return [
            (watch, state)
            for watch in self._watches
            for state in watch.pool.states
            if state.backend.id == backend
        ]

    @property
    def expire_every_s(self) -> float:
        """How often `expire` should run: readings are dropped at most this long after
        `stale_after_s` (a second; a quarter of the shortest, when that is under 4 s)."""
        return min([1.0, *(w.settings.stale_after_s / 4 for w in self._watches)])

    def record(self, backend: str, readings: Sequence[GpuReading]) -> bool:
        """Apply `readings` to every watched member of id `backend`; False when none is (no
        pool with `gpu.enabled` has it)."""
        members = self._members(backend)
        now = self._clock()
        for watch, state in members:
            self._tell(watch.record(state, readings, now))
        return bool(members)

    def expire(self) -> None:
        """Drop every verdict whose readings have grown too old (GpuWatch.expire), now."""
        now = self._clock()
        for watch in self._watches:
            for changed in watch.expire(now):
                self._tell(changed)

    def expiries(self) -> Iterator[tuple[str, BackendState, int]]:
        """Every watched backend, by its pool's model, with the times its readings expired
        (the metrics read these when scraped)."""
        for watch in self._watches:
            for state, expired in watch.expiries():
                yield watch.pool.model, state, expired

    def _tell(self, changed: GpuChanged | None) -> None:
        if changed is not None and self.on_change is not None:
            self.on_change(changed)
