"""Active health checking: each backend probed on an interval with jitter (no thundering herd),
with thresholds so that one bad probe does not flip it.

A backend is marked unhealthy (ACTIVE_CHECK_FAILED) after `unhealthy_threshold` failed probes
in a row and healthy again after `healthy_threshold` good ones. Probe kinds: `http` (GET the
path, 2xx is good), `inference` (a one-token completion, which proves the model answers), and
`heartbeat`, for workers that push instead of being polled: each interval with a heartbeat
(POST /fleet/heartbeat {"backend": ID}) counts as a good probe, each without as a failed one.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Literal

import msgspec

from fleetgate.clock import Clock
from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.periodic import PeriodicTasks
from fleetgate.http.errors import UpstreamError
from fleetgate.http.transport import Transport
from fleetgate.settings import Settings, at_least, jitter, positive_seconds


class ActiveCheckSettings(Settings, frozen=True):
    """A pool's `health_check:` section."""

    enabled: bool = True  # probe every backend of the pool
    kind: Literal["http", "inference", "heartbeat"] = "http"
    path: str | None = None  # for kind http; None: the engine's (fleet/engines.py)
    interval_s: float = 5.0  # between probes of one backend
    jitter: float = 0.2  # each interval is drawn from interval_s * (1 +- jitter)
    timeout_s: float = 2.0  # a probe slower than this failed
    unhealthy_threshold: int = 3  # failed probes in a row that mark a backend unhealthy
    healthy_threshold: int = 2  # good probes in a row that mark it healthy again

    def __post_init__(self) -> None:
        positive_seconds("interval_s", self.interval_s)
        positive_seconds("timeout_s", self.timeout_s)
        jitter("jitter", self.jitter)
        at_least("unhealthy_threshold", self.unhealthy_threshold, 1)
        at_least("healthy_threshold", self.healthy_threshold, 1)


class ProbeTracker:
    """Turns one backend's probe results into its ACTIVE_CHECK_FAILED flag."""

    __slots__ = ("_settings", "_state", "failures", "successes")

    def __init__(self, settings: ActiveCheckSettings, state: BackendState) -> None:
        self._settings = settings
        self._state = state
        self.failures = 0
        self.successes = 0

    def record(self, ok: bool, now: float) -> bool:
        """Count a probe made at `now`; True when a flag changed."""
        state, s = self._state, self._settings
        failing = bool(state.flags & HealthFlag.ACTIVE_CHECK_FAILED)
        if ok and state.flags & HealthFlag.UNPROBED:  # one good probe lets a new backend in,
            # failures while it started up forgotten, at the start of its slow start
            state.flags &= ~(HealthFlag.UNPROBED | HealthFlag.ACTIVE_CHECK_FAILED)
            state.ramp_from = now
            self.successes, self.failures = self.successes + 1, 0
            return True
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if failing and self.successes >= s.healthy_threshold:
                state.flags &= ~HealthFlag.ACTIVE_CHECK_FAILED
                return True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if not failing and self.failures >= s.unhealthy_threshold:
                state.flags |= HealthFlag.ACTIVE_CHECK_FAILED
                return True
        return False


class ActiveChecker:
    """Probes every backend of some pools until stopped."""

    def __init__(
        self,
        client: Transport,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self._client = client
        self._now = clock.now
        self._tasks = PeriodicTasks(rng, clock)
        self._beats: dict[str, int] = {}  # heartbeats received per backend id, for kind heartbeat
        self._probing: dict[BackendState, Callable[[], None]] = {}

    def start(
        self,
        model: str,
        states: Iterable[BackendState],
        settings: ActiveCheckSettings,
        changed: Callable[[float], None],
        *,
        at_once: bool = False,
    ) -> None:
        """Probe each of `states` (backends of `model`) until `stop()`, the first time after
        an interval (`at_once`: now); `changed(now)` is called whenever a backend's flag
        flips (its pool recomputes its candidates)."""
        if not settings.enabled:
            return
        for state in states:
            if settings.kind == "heartbeat":
                self._beats.setdefault(state.backend.id, 0)
            tracker = ProbeTracker(settings, state)
            check = self._check(model, state, tracker, settings, changed)
            self._probing[state] = self._tasks.every(
                settings.interval_s, settings.jitter, check, wait_first=not at_once
            )

    def forget(self, state: BackendState) -> None:
        """Stop probing `state` (it left its pool)."""
        stop = self._probing.pop(state, None)
        if stop is not None:
            stop()
            backend = state.backend.id  # its heartbeats, unless another pool's backend shares it
            if all(s.backend.id != backend for s in self._probing):
                self._beats.pop(backend, None)

    def beat(self, backend_id: str) -> bool:
        """A worker's heartbeat; False if no pool expects heartbeats from that backend."""
        if backend_id not in self._beats:
            return False
        self._beats[backend_id] += 1
        return True

    @property
    def expects_heartbeats(self) -> bool:
        return bool(self._beats)

    def stop(self) -> None:
        self._tasks.stop()
        self._probing.clear()

    def _check(
        self,
        model: str,
        state: BackendState,
        tracker: ProbeTracker,
        s: ActiveCheckSettings,
        changed: Callable[[float], None],
    ) -> Callable[[], Awaitable[None]]:
        """One round of checking `state`: a probe, or counting heartbeats since the last."""
        seen = 0

        async def check() -> None:
            nonlocal seen
            if s.kind == "heartbeat":
                beats = self._beats[state.backend.id]
                ok, seen = beats > seen, beats
            else:
                ok = await self.probe(model, state, s)
            now = self._now()
            if tracker.record(ok, now):
                changed(now)

        return check

    async def probe(self, model: str, state: BackendState, s: ActiveCheckSettings) -> bool:
        """One probe: True when the backend answered well within the timeout; a good one's
        round trip is recorded (how far the backend is: routing/locality.py)."""
        sent = self._now()
        origin = state.backend.origin
        if s.kind == "inference":
            method, path = b"POST", b"/v1/completions"
            body = msgspec.json.encode({"model": model, "prompt": "ping", "max_tokens": 1})
            headers = [(b"content-type", b"application/json"), *state.backend.credentials]
        else:
            method, path, body = b"GET", (s.path or state.kind.health_path).encode(), b""
            headers = list(state.backend.credentials)
        try:
            response = await self._client.request(
                origin, method, path, headers, body, timeout_s=s.timeout_s
            )
            response.expire_in(s.timeout_s, "health probe timed out")
            await response.read()
        except UpstreamError:
            return False
        if not 200 <= response.status < 300:
            return False
        state.latency.record_probe(self._now() - sent)
        return True
