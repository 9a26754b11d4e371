"""A pool: the backends that serve one model, their health, and the pipeline that picks one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.calibration import WeightSettings, speed_factors
from fleetgate.fleet.health import NEVER_ROUTE, HealthSettings
from fleetgate.health.outlier import OutlierDetector, OutlierSettings
from fleetgate.resilience.hedge import HedgeSettings, TtftWindow
from fleetgate.resilience.retry import RetryBudget, RetrySettings
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.pipeline import RoutingPipeline

SLOW_START_FLOOR = 0.1  # a returning backend starts at this share of its weight
SLOW_START_STEPS = 10  # its weight is raised this many times over the window


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long the gateway waits on a backend of the pool (connecting: the client's own)."""

    first_byte_s: float = 180.0  # from sending the request to the answer's head; then 504
    total_s: float = 1800.0  # the whole exchange, a stream's last chunk included; then 504
    idle_s: float = 60.0  # longest silence inside an answer (between stream chunks)
    connect_s: float = 5.0  # opening a new connection to a backend; then the next one
    # What each timeout says when it fires, made once rather than per request.
    total_message: str = field(init=False, repr=False, compare=False)
    idle_message: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        total = f"the answer took longer than the total timeout of {self.total_s:g} s"
        idle = f"the backend sent nothing for the idle timeout of {self.idle_s:g} s"
        object.__setattr__(self, "total_message", total)
        object.__setattr__(self, "idle_message", idle)


class Pool:
    """Backends of one model: who is routable now, and the in-flight counts policies read.

    `candidates` is a tuple rebuilt only when health changes, so policies can keep indexes
    keyed on its identity. Time-driven changes (an ejection ending, a backoff expiring, a slow
    start stepping up) are applied lazily by the first pick at or after `next_check`.
    """

    __slots__ = (
        "_full",
        "_health",
        "_next_calibration",
        "_next_check",
        "_outliers",
        "_weights",
        "budget",
        "candidates",
        "hedge",
        "in_flight",
        "model",
        "pipeline",
        "prefill",
        "retries",
        "states",
        "timeouts",
        "ttft",
    )  # fmt: skip

    def __init__(
        self,
        model: str,
        states: Sequence[BackendState],
        pipeline: RoutingPipeline,
        timeouts: Timeouts | None = None,
        health: HealthSettings | None = None,
        outliers: OutlierSettings | None = None,
        retries: RetrySettings | None = None,
        hedge: HedgeSettings | None = None,
        weights: WeightSettings | None = None,
    ) -> None:
        self.model = model
        self.hedge = hedge or HedgeSettings()
        self.ttft = TtftWindow(self.hedge)  # recent times to first token, for hedging
        self.retries = retries or RetrySettings()
        self.budget = RetryBudget(self.retries)
        self.in_flight = 0  # requests in flight to any backend of the pool
        self.states = tuple(states)
        self.pipeline = pipeline
        self.prefill: Pool | None = None  # prefill/decode disaggregation: the prefill backends
        self.timeouts = timeouts or Timeouts()
        self._health = health or HealthSettings()
        self._outliers = OutlierDetector(outliers or OutlierSettings(), len(self.states))
        self._weights = weights or WeightSettings()
        self._next_calibration = self._weights.interval_s if self._weights.enabled else math.inf
        self._next_check = math.inf
        self._full: set[BackendState] = set()  # at their max_in_flight
        self.candidates: tuple[BackendState, ...] = ()
        self.refresh(0.0)

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
        self._next_check = min(
            [*backoffs, *ramps, self._outliers.next_return(), self._next_calibration]
        )

    def _ramping(self) -> bool:
        return any(s.ramp_from is not None for s in self.states)

    @property
    def ready(self) -> bool:
        """Some backend is healthy (a pool in panic is not ready)."""
        return any(not s.flags for s in self.states)

    def pick(self, request: RoutingRequest, now: float) -> BackendState | None:
        if now >= self._next_check:
            self._tick(now)
        if not self.candidates:
            return None
        return self.pipeline.pick(request, self.candidates, now)

    def pick_other(
        self, request: RoutingRequest, now: float, tried: Sequence[BackendState]
    ) -> BackendState | None:
        """A pick among the candidates not in `tried` (for a retry); O(n), only on retries."""
        if now >= self._next_check:
            self._tick(now)
        others = [s for s in self.candidates if s not in tried]
        if not others:
            return None
        return self.pipeline.pick(request, others, now)

    def _tick(self, now: float) -> None:
        for state in self._outliers.return_due(now):
            state.ramp_from = now
        changed = [s for s in self.states if s.ramp_from is not None]
        if now >= self._next_calibration:
            self._next_calibration = now + self._weights.interval_s
            for state, factor in zip(
                self.states, speed_factors(self.states, self._weights), strict=True
            ):
                state.speed = factor
            changed = list(self.states)
        slow_start = self._health.slow_start_s
        for state in changed:
            share = 1.0
            if state.ramp_from is not None:
                progress = (now - state.ramp_from) / slow_start if slow_start > 0 else 1.0
                if progress >= 1.0:
                    state.ramp_from = None
                else:  # max(floor, elapsed / window), raised in steps
                    share = max(SLOW_START_FLOOR, progress)
            weight = state.backend.weight * state.speed * share
            if weight != state.weight:
                state.weight = weight
                self.pipeline.picker.load_changed(state)
        self.refresh(now)

    def begin(self, state: BackendState, now: float, prompt_tokens: int = 0) -> None:
        """A request with this many prompt tokens (estimated) was sent to `state`."""
        state.in_flight += 1
        state.in_flight_tokens += prompt_tokens
        state.pending_prefill += prompt_tokens
        self.in_flight += 1
        self.pipeline.picker.load_changed(state)
        limit = state.backend.max_in_flight
        if limit is not None and state.in_flight >= limit:
            self._full.add(state)
            self.refresh(now)

    def prefilled(self, state: BackendState, prompt_tokens: int) -> None:
        """A request's first token arrived: its prompt is no longer waiting to be prefilled."""
        state.pending_prefill -= prompt_tokens

    def end(
        self, state: BackendState, now: float, prompt_tokens: int = 0, unprefilled: int = 0
    ) -> None:
        """A request to `state` finished, whatever its outcome; `prompt_tokens` as given to
        `begin`, `unprefilled` those of them not yet released by `prefilled`."""
        state.in_flight -= 1
        state.in_flight_tokens -= prompt_tokens
        state.pending_prefill -= unprefilled
        self.in_flight -= 1
        self.pipeline.picker.load_changed(state)
        if state in self._full and state.in_flight < (state.backend.max_in_flight or 0):
            self._full.discard(state)
            self.refresh(now)

    # -- what the proxy learnt ----------------------------------------------------------------

    def succeeded(self, state: BackendState, now: float) -> None:
        self._outliers.success(state, now)

    def failed(self, state: BackendState, now: float) -> None:
        """A failure that is the backend's fault: it may eject it."""
        if self._outliers.failure(state, now):
            self.refresh(now)

    def backpressure(self, state: BackendState, now: float, retry_after_s: float) -> None:
        """The engine asked for no traffic for a while: not a failure, just skip it."""
        state.backoff_until = max(state.backoff_until, now + retry_after_s)
        self.refresh(now)

    def ejections(self, state: BackendState) -> int:
        return self._outliers.ejections(state)
