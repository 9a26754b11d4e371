"""A pool's autoscaling loop: every `interval_s` it reads the pool's signals, asks the
recommender how many replicas it should run (autoscale/recommender.py), shows that (the
`fleetgate_autoscale_*` gauges, for KEDA or an HPA on an external metric, and GET
/admin/autoscale) and, with an actuator, makes it so.

Up: the actuator starts the missing replicas; each joins the pool at a slow start. Replicas
the scaler was draining are taken back first (they are warm). Down: the least loaded replicas
the actuator owns are drained (nothing new is routed to them; what they have finishes), and
only once this gateway has nothing in flight on one is it removed from the pool and stopped.
So a scale-down cuts no request.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from fleetgate.autoscale.recommender import Recommendation, Recommender, Signals
from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.engine_load import EngineLoad
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.membership import Membership
from fleetgate.fleet.pool import Pool
from fleetgate.shared.lease import Lease

log = logging.getLogger("fleetgate.autoscale")

LEAVING = HealthFlag.DRAINING | HealthFlag.GONE  # not counted as replicas


class Actuator(Protocol):
    """What changes a pool's replicas (autoscale/local.py; Kubernetes: autoscale/kubernetes.py)."""

    name: str

    def owns(self, backend: str) -> bool:
        """May it remove this backend (one it started or its workload runs)."""
        ...

    async def start(self, count: int, desired: int) -> int:
        """Start the replicas missing for `desired` in all, `count` as the pool counts them
        (they join the pool as they come up); how many it started."""
        ...

    async def stop(self, backends: list[str]) -> None:
        """Stop these replicas: drained, and out of the pool."""
        ...

    def close(self) -> None:
        """Autoscaling of the pool ends (the gateway stops, or a reload turns it off)."""
        ...


ActuatorFactory = Callable[[str], Actuator]  # a pool's actuator, by its model


class AutoscaleStatus(msgspec.Struct):
    """A pool's last decision, as GET /admin/autoscale and the gauges show it."""

    model: str
    replicas: int  # serving now (not draining)
    desired: int
    raw: int  # what the signals alone asked for
    floor: int  # min_replicas, or a scheduled peak's
    reason: str
    signals: Signals
    draining: list[str]  # being drained before removal
    starting: int  # being started
    actuator: str | None  # None: recommend only
    acting: bool  # this gateway's actuator acts (it holds the pool's lease, or needs none)
    scaled_up: int = 0  # replicas started, since the gateway started
    scaled_down: int = 0  # and removed after their drain


@dataclass(frozen=True, slots=True)
class PoolNow:
    """A pool as the config in use has it, with what its scaler reads besides."""

    pool: Pool
    queued: int  # requests in its admission queue
    burn_rate: float | None  # its objectives' fastest burn, shortest window (None: no SLO)
    stale_after_s: float  # engine readings older than this are not trusted


def pool_signals(now_: PoolNow, now: float) -> Signals:
    """What `pool` carries now: its replicas (members not draining), requests in flight (on
    its load board: every gateway's, when the board is shared) and waiting (`queued` in
    admission, plus the engines' own queues), prompt tokens not yet prefilled, the engines'
    mean KV use, and its SLO's burn rate."""
    pool, stale_after_s = now_.pool, now_.stale_after_s
    serving = [s for s in pool.states if not s.flags & LEAVING]
    loads = pool.board.loads([s.backend.id for s in serving])
    engines = [
        e
        for s in serving
        if (e := _fresh(s, now, stale_after_s)) is not None
        and math.isfinite(e.waiting)
        and math.isfinite(e.kv_usage)
    ]  # fmt: skip (an engine's NaN would poison the averages for good)
    return Signals(
        replicas=len(serving),
        queued=float(now_.queued + sum(e.waiting for e in engines)),
        in_flight=float(sum(load.in_flight for load in loads)),
        prefill_tokens=float(sum(load.pending_prefill for load in loads)),
        kv_usage=sum(e.kv_usage for e in engines) / len(engines) if engines else None,
        burn_rate=now_.burn_rate,
    )


def _fresh(state: BackendState, now: float, stale_after_s: float) -> EngineLoad | None:
    return None if state.engine is None else state.engine.fresh(now, stale_after_s)


class PoolScaler:
    """One pool's loop (module docstring). `tick` is run every `interval_s`."""

    def __init__(
        self,
        pool: Callable[[], PoolNow | None],
        recommender: Recommender,
        actuator: Actuator | None,
        members: Membership,
        *,
        clocks: tuple[Callable[[], float], Callable[[], float]],
        model: str,
        lease: Lease | None = None,
        smoothing_s: float = 0.0,
    ) -> None:
        self._pool = pool  # None: the config in use has no such pool
        self._recommender = recommender
        self._actuator = actuator
        self._members = members
        # The gateway's clock (engine readings' ages), and the wall clock (the schedule's).
        self._clock, self._wall_clock = clocks
        self._model = model
        # Among gateways sharing state, the one holding it acts (every one shows its decision):
        # one workload, one writer. None: this gateway alone acts for the pool.
        self._lease = lease
        self._smoothing_s = smoothing_s
        self._smoothed: tuple[float, Signals] | None = None  # (when, the averaged signals)
        self._draining: set[str] = set()
        self._starting = 0
        self._up = self._down = 0
        self.status: AutoscaleStatus | None = None

    async def tick(self) -> None:
        found = self._pool()
        if found is None:
            return
        pool = found.pool
        now = self._clock()
        signals = self._smooth(pool_signals(found, now), now)
        decision = self._recommender.recommend(signals, self._wall_clock())
        self._show(pool, signals, decision)
        if self._actuator is not None and (self._lease is None or await self._lease.renew()):
            try:
                await self._act(pool, signals.replicas, decision.desired, self._actuator)
                await self._finish_drains(pool)
            except Exception:  # (a backend removed meanwhile, a worker that cannot start...)
                # One tick's failure must not end the loop: the next tick tries again.
                log.exception("autoscale %s: the actuator failed this tick", self._model)
            self._show(pool, signals, decision)

    def _smooth(self, signals: Signals, now: float) -> Signals:
        """The load signals averaged over about `smoothing_s` (exponentially weighted by the
        time between readings); the replica count and the burn rate as they are."""
        last, self._smoothed = self._smoothed, (now, signals)
        if last is None or self._smoothing_s <= 0:
            return signals
        then, before = last
        a = 1.0 - math.exp(-max(0.0, now - then) / self._smoothing_s)
        kv = signals.kv_usage
        if kv is not None and before.kv_usage is not None:
            kv = before.kv_usage + a * (kv - before.kv_usage)
        smoothed = msgspec.structs.replace(
            signals,
            queued=before.queued + a * (signals.queued - before.queued),
            in_flight=before.in_flight + a * (signals.in_flight - before.in_flight),
            prefill_tokens=before.prefill_tokens
            + a * (signals.prefill_tokens - before.prefill_tokens),
            kv_usage=kv,
        )
        self._smoothed = (now, smoothed)
        return smoothed

    def _show(self, pool: Pool, signals: Signals, decision: Recommendation) -> None:
        serving = sum(1 for s in pool.states if not s.flags & LEAVING)
        self.status = AutoscaleStatus(
            model=self._model, replicas=serving, desired=decision.desired,
            raw=decision.raw, floor=decision.floor, reason=decision.reason, signals=signals,
            draining=sorted(self._draining), starting=self._starting,
            actuator=None if self._actuator is None else self._actuator.name,
            acting=self._actuator is not None and (self._lease is None or self._lease.held()),
            scaled_up=self._up, scaled_down=self._down,
        )  # fmt: skip

    async def _act(self, pool: Pool, replicas: int, desired: int, actuator: Actuator) -> None:
        if desired > replicas + self._starting:
            needed = desired - replicas - self._starting
            for backend in sorted(self._draining):  # warm already: take them back
                if needed <= 0:
                    break
                self._draining.discard(backend)
                if backend in pool.members:  # (not removed meanwhile by another hand)
                    self._members.drain(backend, False, self._model)
                    needed -= 1
            if needed > 0:
                self._starting += needed
                try:
                    self._up += await actuator.start(needed, desired)
                finally:
                    self._starting -= needed
        elif desired < replicas:
            self._drain(pool, replicas - desired, actuator)

    def _drain(self, pool: Pool, count: int, actuator: Actuator) -> None:
        """Drain the `count` least loaded replicas the actuator may remove."""
        owned = [s for s in pool.states if not s.flags & LEAVING and actuator.owns(s.backend.id)]
        loads = pool.board.loads([s.backend.id for s in owned])
        by_load = sorted(zip(owned, loads, strict=True), key=lambda p: p[1].in_flight)
        for state, _ in by_load[:count]:
            self._draining.add(state.backend.id)
            self._members.drain(state.backend.id, True, self._model)

    async def _finish_drains(self, pool: Pool) -> None:
        """Remove and stop the drained replicas that have nothing in flight here any more."""
        done = [
            b for b in sorted(self._draining)
            if b not in pool.members or pool.board.own(b).in_flight == 0
        ]  # fmt: skip
        for backend in done:
            self._draining.discard(backend)
            if backend in pool.members:
                self._members.remove(backend, self._model)
        if done and self._actuator is not None:
            await self._actuator.stop(done)
            self._down += len(done)

    def close(self) -> None:
        if self._actuator is not None:
            self._actuator.close()
