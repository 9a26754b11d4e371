"""Load on each backend over a run, read from a fleetgate gateway's /metrics once a second.

A response does not say which backend served it, but the gateway counts it: while the run
lasts, `BackendSampler` scrapes GET {target}/metrics (one scrape at a time, each given about a
second) and keeps, per backend, `fleetgate_backend_in_flight_requests` and
`fleetgate_backend_healthy` (gauges) and the per-second increase of `fleetgate_requests_total`
(answers, and those with status >= 500 as errors). A target whose /metrics is absent, is not
Prometheus text, or has none of these series (a plain vLLM server) gives no samples and a
reason; it never fails the run.

A backend is the gateway's `backend` label (its id, e.g. "127.0.0.1:8101"); a backend in the
pools of several models is one server, so its series are summed over `model`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from fleetgate.http.client import HttpClient, Origin
from fleetgate.http.errors import UpstreamError
from fleetgate.lifecycle.events import NO_BACKEND

Clock = Callable[[], float]  # monotonic seconds
Sleep = Callable[[float], Awaitable[None]]

IN_FLIGHT = "fleetgate_backend_in_flight_requests"  # gauge, by model and backend
HEALTHY = "fleetgate_backend_healthy"  # gauge: 1, or 0 while a health detector flags it
ANSWERS = "fleetgate_requests_total"  # counter, by model, backend and status
NEEDS_GATEWAY = "per-backend plots need a fleetgate gateway as the target"
METRICS_PATH = b"/metrics"
# Only these series' lines are handed to the parser: the parse runs on the load generator's
# event loop, and a large fleet's whole page (histograms per backend) takes tens of ms.
_WANTED = tuple(name + suffix for name in (IN_FLIGHT, HEALTHY, ANSWERS) for suffix in ("{", " "))


class NotAGateway(Exception):
    """The target's /metrics answered, but not as a fleetgate gateway's; the message says how."""


@dataclass(frozen=True, slots=True)
class Scrape:
    """One /metrics page: the gauges by backend, the answer counters by (backend, model, status)."""

    in_flight: dict[str, float]
    healthy: dict[str, bool]  # False when flagged in any of its pools
    answered: dict[tuple[str, str, str], float]

    @property
    def backends(self) -> list[str]:
        names = {*self.in_flight, *self.healthy, *(key[0] for key in self.answered)}
        return sorted(names)


def parse_scrape(text: str) -> Scrape:
    """The per-backend series of a Prometheus text page; raises NotAGateway when it is not
    Prometheus text or has none of them. Requests the gateway answered itself (backend
    "none": refused before routing) are no backend's and are left out."""
    lines = [line for line in text.splitlines() if line.startswith(_WANTED)]
    in_flight: dict[str, float] = {}
    healthy: dict[str, bool] = {}
    answered: dict[tuple[str, str, str], float] = {}
    try:
        for family in text_string_to_metric_families("\n".join(lines) + "\n"):
            for sample in family.samples:
                backend = sample.labels.get("backend")
                if backend is None or backend == NO_BACKEND:
                    continue
                value = float(sample.value)
                if not math.isfinite(value):
                    continue
                if sample.name == IN_FLIGHT:
                    in_flight[backend] = in_flight.get(backend, 0.0) + value
                elif sample.name == HEALTHY:
                    healthy[backend] = healthy.get(backend, True) and value >= 1.0
                elif sample.name == ANSWERS:
                    key = (backend, sample.labels.get("model", ""), sample.labels.get("status", ""))
                    answered[key] = answered.get(key, 0.0) + value  # over any other labels
    except ValueError as exc:
        raise NotAGateway(f"its /metrics is not Prometheus text ({exc})") from None
    if not (in_flight or healthy or answered):
        raise NotAGateway(f"its /metrics has no {IN_FLIGHT} or {ANSWERS} series")
    return Scrape(in_flight, healthy, answered)


def increase(before: float, after: float) -> float:
    """A counter's increase between two readings; one that went down was reset (a restart)
    and has counted `after` since, as Prometheus's increase() reads it."""
    return after - before if after >= before else after


def _is_error(status: str) -> bool:
    return status.isdigit() and int(status) >= 500


@dataclass(slots=True)
class BackendSeries:
    """One backend's samples, a scrape each; None where that scrape did not have it."""

    at_s: list[float] = field(default_factory=list)  # seconds into the run, when it answered
    in_flight: list[float | None] = field(default_factory=list)
    healthy: list[bool | None] = field(default_factory=list)
    # Increase since the previous scrape / the seconds between: None at the run's first scrape.
    answers_per_s: list[float | None] = field(default_factory=list)
    errors_per_s: list[float | None] = field(default_factory=list)  # status >= 500

    def unhealthy_spans(self, end_s: float) -> list[tuple[float, float]]:
        """(from, to) of each stretch it was flagged: from a sample that said so to the next
        sample that did not (or `end_s`)."""
        spans: list[tuple[float, float]] = []
        since: float | None = None
        for at_s, healthy in zip(self.at_s, self.healthy, strict=True):
            if healthy is False and since is None:
                since = at_s
            elif healthy is not False and since is not None:
                spans.append((since, at_s))
                since = None
        if since is not None:
            spans.append((since, max(end_s, since)))
        return spans


@dataclass(frozen=True, slots=True)
class BackendLoad:
    """What a run recorded of its backends: a series per backend, or why there is none."""

    backends: dict[str, BackendSeries]
    interval_s: float
    unavailable: str | None = None  # why nothing was recorded, when nothing was


class ScrapeSeries:
    """A run's scrapes, differenced into per-second answers and errors by backend.

    A counter series missing from the previous scrape had counted nothing yet (it appears at
    its first count), so a backend that appears mid-run is counted from 0; counters are
    differenced series by series, then summed by backend.
    """

    def __init__(self) -> None:
        self.backends: dict[str, BackendSeries] = {}
        self._last: tuple[float, Scrape] | None = None

    def add(self, at_s: float, scrape: Scrape) -> None:
        answers: dict[str, float] = {}
        errors: dict[str, float] = {}
        elapsed = 0.0
        if self._last is not None:
            last_at, last = self._last
            elapsed = at_s - last_at
            for key, total in scrape.answered.items():
                backend, _, status = key
                counted = increase(last.answered.get(key, 0.0), total)
                answers[backend] = answers.get(backend, 0.0) + counted
                if _is_error(status):
                    errors[backend] = errors.get(backend, 0.0) + counted
        rated = elapsed > 0
        for name in scrape.backends:
            series = self.backends.setdefault(name, BackendSeries())
            series.at_s.append(at_s)
            series.in_flight.append(scrape.in_flight.get(name))
            series.healthy.append(scrape.healthy.get(name))
            series.answers_per_s.append(answers.get(name, 0.0) / elapsed if rated else None)
            series.errors_per_s.append(errors.get(name, 0.0) / elapsed if rated else None)
        self._last = (at_s, scrape)


class BackendSampler:
    """Scrapes a target's /metrics every `interval_s` while `running()`: one scrape at a time,
    each given `timeout_s`. A first answer that is not a fleetgate gateway's stops it; a
    scrape that fails later (a timeout, a 503) is skipped, and the next scrape's rates span
    the gap."""

    def __init__(
        self,
        client: HttpClient,
        origin: Origin,
        *,
        clock: Clock,
        sleep: Sleep = asyncio.sleep,
        headers: tuple[tuple[bytes, bytes], ...] = (),
        interval_s: float = 1.0,
        timeout_s: float = 1.0,  # a scrape later than this is skipped, not waited for
    ) -> None:
        self._client = client
        self._origin = origin
        self._clock = clock
        self._sleep = sleep
        self._headers = list(headers)
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._series = ScrapeSeries()
        self._start = 0.0  # on the clock, set when sampling starts
        self._answered = False  # a scrape has read the series: the target is a gateway
        self._unavailable: str | None = None
        self._last_failure = "the run ended first"

    def load(self) -> BackendLoad:
        """What was sampled so far, or why nothing was."""
        backends = self._series.backends
        if backends:
            return BackendLoad(backends, self._interval_s)
        reason = self._unavailable or f"its /metrics never answered: {self._last_failure}"
        return BackendLoad({}, self._interval_s, reason)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Sample in the background for as long as the block runs, and once more when it
        ends normally (so the answers of the run's last second are counted)."""
        task = asyncio.create_task(self.run())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.wait((task,))
        if not task.cancelled() and task.exception() is not None:
            self._unavailable = f"sampling failed: {task.exception()!r}"
        elif self._answered:
            await self._sample()

    async def run(self) -> None:
        """Scrape until cancelled, or until the target turns out not to be a gateway."""
        self._start = self._clock()
        due = self._start
        while await self._sample():
            due = max(due + self._interval_s, self._clock())  # late: the next at once
            await self._sleep(max(0.0, due - self._clock()))

    async def _sample(self) -> bool:
        """Scrape once and keep what it read; False when the target is no gateway."""
        try:
            scrape = await self._scrape()
        except NotAGateway as exc:
            if not self._answered:  # a gateway that answers badly once is still a gateway
                self._unavailable = str(exc)
                return False
            self._last_failure = str(exc)
        except (UpstreamError, TimeoutError) as exc:
            self._last_failure = str(exc) or type(exc).__name__
        else:
            self._answered = True
            self._series.add(self._clock() - self._start, scrape)
        return True

    async def _scrape(self) -> Scrape:
        async with asyncio.timeout(self._timeout_s):
            response = await self._client.request(self._origin, b"GET", METRICS_PATH, self._headers)
            try:
                body = await response.read()
            finally:
                response.close()
        if response.status != 200:
            raise NotAGateway(f"GET /metrics answered {response.status}")
        try:
            text = body.decode()
        except UnicodeDecodeError:
            raise NotAGateway("its /metrics is not text") from None
        return parse_scrape(text)


def backends_json(load: BackendLoad) -> dict[str, object]:
    """The document written to backends.json."""
    return {
        "interval_s": load.interval_s,
        "backends": {
            name: {
                "at_s": [round(t, 3) for t in s.at_s],
                "in_flight": s.in_flight,
                "healthy": s.healthy,
                "answers_per_s": [_round(r) for r in s.answers_per_s],
                "errors_per_s": [_round(r) for r in s.errors_per_s],
            }
            for name, s in sorted(load.backends.items())
        },
    }


def _round(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 3)


def needs_gateway(load: BackendLoad | None) -> str:
    """The sentence a report shows where the per-backend plot would be."""
    why = "" if load is None or load.unavailable is None else f" ({load.unavailable})"
    return f"Load per backend is not shown: {NEEDS_GATEWAY}{why}."
