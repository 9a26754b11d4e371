"""Passive outlier detection, fed by the proxy path: a backend is ejected after
`consecutive_failures` failures in a row, or when at least `failure_rate` of its requests in
an interval failed (once it had `min_requests` there): the second catches a backend failing
30% of the time, which rarely fails five times running.

Ejection time grows with each ejection of the same backend and is capped:
    ejected for min(base_ejection_s * n, max_ejection_s)   where n counts its ejections,
and n falls back by one for every max_ejection_s it then stays un-ejected (Envoy's rule).
At most `max_ejected_share` of a pool is ejected at once. A returning backend is half-open:
its first failure ejects it again at once; its first success closes the circuit.

What counts: connection failures, timeouts, broken responses and 5xx are failures. An engine's
429, or 503 with Retry-After, is backpressure, not a failure; a 4xx the request caused is
never the backend's fault. Those two are simply not reported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.health import HealthFlag


@dataclass(frozen=True, slots=True)
class OutlierSettings:
    consecutive_failures: int = 5  # failures in a row that eject a backend
    failure_rate: float = 0.2  # ...or this share of its requests failing within an interval
    min_requests: int = 20  # requests in the interval before the failure rate counts
    interval_s: float = 10.0  # the failure rate's window
    base_ejection_s: float = 10.0  # first ejection; the n-th lasts n times as long
    max_ejection_s: float = 300.0  # cap on one ejection
    max_ejected_share: float = 0.5  # at most this share of a pool is ejected at once


class _Record:
    __slots__ = (
        "ejected_until", "ejections", "failures", "half_open", "returned_at", "window_failures",
        "window_requests", "window_start",
    )  # fmt: skip

    def __init__(self) -> None:
        self.window_start = 0.0
        self.window_requests = 0
        self.window_failures = 0
        self.failures = 0
        self.ejections = 0
        self.ejected_until = 0.0
        self.returned_at = 0.0
        self.half_open = False


class OutlierDetector:
    """Ejects and returns the backends of one pool; O(1) per result, O(ejected) per tick."""

    def __init__(self, settings: OutlierSettings, pool_size: int) -> None:
        self._settings = settings
        self._pool_size = pool_size
        self._records: dict[BackendState, _Record] = {}
        self._ejected: set[BackendState] = set()

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
        if record.half_open:
            record.half_open = False
        # Forgive one past ejection per max_ejection_s of good behaviour since the return.
        if record.ejections and now - record.returned_at > self._settings.max_ejection_s:
            record.ejections -= 1
            record.returned_at = now

    def failure(self, state: BackendState, now: float) -> bool:
        """Count a failure; True when it ejected the backend."""
        record = self._record(state)
        record.failures += 1
        self._count(record, now, True)
        if state in self._ejected:
            return False
        s = self._settings
        rate_too_high = (
            record.window_requests >= s.min_requests
            and record.window_failures >= s.failure_rate * record.window_requests
        )
        if not (record.half_open or record.failures >= s.consecutive_failures or rate_too_high):
            return False
        if len(self._ejected) + 1 > self._settings.max_ejected_share * self._pool_size:
            return False  # too many out already: keep serving rather than shrink further
        record.ejections += 1
        duration = min(
            self._settings.base_ejection_s * record.ejections, self._settings.max_ejection_s
        )
        record.ejected_until = now + duration
        record.failures = 0
        record.window_start, record.window_requests, record.window_failures = now, 0, 0
        record.half_open = False
        self._ejected.add(state)
        state.flags |= HealthFlag.EJECTED
        return True

    def next_return(self) -> float:
        """When the next ejected backend is due back (inf when none is ejected)."""
        return min((self._records[s].ejected_until for s in self._ejected), default=float("inf"))

    def return_due(self, now: float) -> list[BackendState]:
        """Un-eject the backends whose time is up, half-open; returns them."""
        due = [s for s in self._ejected if self._records[s].ejected_until <= now]
        for state in due:
            self._ejected.discard(state)
            record = self._records[state]
            record.half_open = True
            record.returned_at = now
            state.flags &= ~HealthFlag.EJECTED
        return due

    def ejections(self, state: BackendState) -> int:
        record = self._records.get(state)
        return record.ejections if record is not None else 0
