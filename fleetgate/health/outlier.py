"""Passive outlier detection, fed by the request lifecycle's events: a backend is ejected after
`consecutive_failures` failures in a row, or when at least `failure_rate` of its requests in
an interval failed (once it had `min_requests` there): the second catches a backend failing
30% of the time, which rarely fails five times running.

Ejection time grows with each ejection of the same backend and is capped:
    ejected for min(base_ejection_s * n, max_ejection_s)   where n counts its ejections,
and n falls back by one for every max_ejection_s it then stays un-ejected (Envoy's rule).
At most `max_ejected_share` of a pool is ejected at once. A returning backend is half-open:
its first failure ejects it again at once; its first success closes the circuit.

What counts is decided here, from each attempt's end (lifecycle/events.py AttemptEnded): a
connection that failed, a timeout, a broken response or a 5xx is the backend's failure. An
engine's 429, or 503 with Retry-After, is backpressure: the backend is skipped until then (a
429 without Retry-After: for a second), not failed. A 4xx is the request's fault and counts as
a success; an attempt the gateway cancelled (the client left, a hedge won), that its own code
broke, that hit a timeout the client shortened, or that the gateway had no socket for, counts
for nothing. A 5xx that an earlier attempt of the request also got, from another backend, is
the request's fault too (a body that breaks every engine): it counts for nothing, and the
failure counted for that backend is taken back (unless it has ejected it already).
"""

from __future__ import annotations

from collections.abc import Callable

from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.pool import Pool
from fleetgate.lifecycle.events import NOT_UPSTREAM, AttemptEnded, Ejected, EjectReason
from fleetgate.lifecycle.hooks import Hooks
from fleetgate.settings import Settings, at_least, ordered, positive_seconds, within


class OutlierSettings(Settings, frozen=True):
    """A pool's `outlier:` section."""

    consecutive_failures: int = 5  # failures in a row that eject a backend
    failure_rate: float = 0.2  # ...or this share of its requests failing within an interval
    min_requests: int = 20  # requests in the interval before the failure rate counts
    interval_s: float = 10.0  # the failure rate's window
    base_ejection_s: float = 10.0  # first ejection; the n-th lasts n times as long
    max_ejection_s: float = 300.0  # cap on one ejection
    max_ejected_share: float = 0.5  # at most this share of a pool is ejected at once

    def __post_init__(self) -> None:
        at_least("consecutive_failures", self.consecutive_failures, 1)
        within("failure_rate", self.failure_rate, 0, 1, open_low=True)
        at_least("min_requests", self.min_requests, 1)
        positive_seconds("interval_s", self.interval_s)
        positive_seconds("base_ejection_s", self.base_ejection_s)
        ordered("base_ejection_s", self.base_ejection_s, "max_ejection_s", self.max_ejection_s)
        within("max_ejected_share", self.max_ejected_share, 0, 1)


class _Record:
    __slots__ = (
        "ejections", "failures", "half_open", "returned_at", "window_failures", "window_requests",
        "window_start",
    )  # fmt: skip

    def __init__(self) -> None:
        self.window_start = 0.0
        self.window_requests = 0
        self.window_failures = 0
        self.failures = 0
        self.ejections = 0
        self.returned_at = 0.0
        self.half_open = False


class OutlierDetector:
    """Ejects the backends of one pool (through the pool, which returns them when their time is
    up); O(1) per result. A returning backend is half-open from the moment it was ejected."""

    def __init__(self, settings: OutlierSettings, pool: Pool) -> None:
        self._settings = settings
        self._pool = pool
        self._records: dict[BackendState, _Record] = {}
        # Told of each ejection (the pool's emitter, set once its hooks are complete).
        self.on_ejected: Callable[[Ejected], None] | None = None

    def subscribe(self, hooks: Hooks) -> None:
        hooks.subscribe(AttemptEnded, self.on_attempt_ended)

    def on_attempt_ended(self, event: AttemptEnded) -> None:
        """The rule of what an attempt's end says of its backend (the module's docstring)."""
        pool = self._pool
        state = pool.members.get(event.backend)
        if state is None:  # it has left the pool: nothing it does counts any more
            return
        error, status = event.error, event.status
        if error is not None:
            if error not in NOT_UPSTREAM:
                self.failure(state, event.at, event.request_id)
        elif status == 429 or (status == 503 and event.retry_after_s is not None):
            wait_s = 1.0 if event.retry_after_s is None else event.retry_after_s
            pool.backpressure(state, event.at, wait_s)
        elif status >= 500:
            if status != event.prior_status:
                self.failure(state, event.at, event.request_id)
            elif event.prior_backend is not None and event.prior_backend != event.backend:
                prior = pool.members.get(event.prior_backend)
                if prior is not None:
                    self._take_back(prior, event.at)
        else:
            self.success(state, event.at)

    def _record(self, state: BackendState) -> _Record:
        record = self._records.get(state)
        if record is None:
            record = self._records[state] = _Record()
        return record

    def _count(self, record: _Record, now: float, failed: bool) -> None:
        if now - record.window_start >= self._settings.interval_s:
            record.window_start, record.window_requests, record.window_failures = now, 0, 0
        record.window_requests += 1
        record.window_failures += failed

    def success(self, state: BackendState, now: float) -> None:
        record = self._record(state)
        self._count(record, now, False)
        record.failures = 0
        if state.flags and self._pool.is_ejected(state):  # flags first: 0 for the healthy
            return  # an answer that was on its way: the return stays half-open
        record.half_open = False
        # Forgive one past ejection per max_ejection_s of good behaviour since the return.
        if record.ejections and now - record.returned_at > self._settings.max_ejection_s:
            record.ejections -= 1
            record.returned_at = now

    def _take_back(self, state: BackendState, now: float) -> None:
        """Undo one failure counted for `state`: it was the request's, not the backend's."""
        record = self._record(state)
        record.failures = max(0, record.failures - 1)
        if now - record.window_start < self._settings.interval_s:
            record.window_requests = max(0, record.window_requests - 1)
            record.window_failures = max(0, record.window_failures - 1)

    def failure(self, state: BackendState, now: float, request_id: bytes = b"") -> bool:
        """Count a failure (of the attempt of `request_id`); True when it ejected the backend."""
        if state.flags & HealthFlag.GONE:  # leaving (or left): never counted as ejected, which
            return False  # would hold a place in max_ejected_share a member may need
        record = self._record(state)
        record.failures += 1
        self._count(record, now, True)
        if self._pool.is_ejected(state):
            return False
        s = self._settings
        reason: EjectReason
        if record.half_open:
            reason = "half_open"
        elif record.failures >= s.consecutive_failures:
            reason = "consecutive_failures"
        elif (
            record.window_requests >= s.min_requests
            and record.window_failures >= s.failure_rate * record.window_requests
        ):
            reason = "failure_rate"
        else:
            return False
        pool = self._pool
        if pool.ejected + 1 > s.max_ejected_share * len(pool.states):
            return False  # too many out already: keep serving rather than shrink further
        record.ejections += 1
        until = now + min(s.base_ejection_s * record.ejections, s.max_ejection_s)
        record.failures = 0
        record.window_start, record.window_requests, record.window_failures = now, 0, 0
        record.half_open = True  # from its return on, one failure ejects it again
        record.returned_at = until  # where good behaviour starts to count (forgiveness)
        pool.eject(state, now, until)
        if self.on_ejected is not None:
            self.on_ejected(Ejected(request_id, now, pool.model, state.backend.id, until, reason))
        return True

    def ejections(self, state: BackendState) -> int:
        record = self._records.get(state)
        return record.ejections if record is not None else 0
