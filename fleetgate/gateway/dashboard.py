"""The live dashboard (`server.dashboard`, on by default; behind the admin key when auth is on):

    GET /dashboard              the page; its script, styles and uPlot (vendored, MIT) beside it
    GET /dashboard/snapshot     the fleet now, as JSON: every pool's backends (health, load,
                                the engine's own, the GPU agent's verdict or its staleness),
                                admission and objectives; each tenant's use;
                                the last ejections; the last five minutes second by second
    GET /dashboard/events       the same as server-sent events, one a second; the first carries
                                the whole history, each later one only the seconds since
    GET /dashboard/regions      each region (a backend's `region` label; "" none): its backends,
                                requests/s and error rate over the last five minutes, TTFT and
                                E2E p50 and p99 over the last minute (observe/live.py), and for
                                the gateway's own region each pool's `locality` state (phase,
                                keep and spill shares, spilled requests, failovers and how long
                                the last took: routing/regions.py); the snapshot's `regions`

The page, its assets and the data are served with a strict Content-Security-Policy (scripts
and styles from the page's own origin only, no framing) and read nothing from the network but
these paths. A stream ends when the client leaves, when the gateway drains (`close`), and
after `max_stream_s` (the browser's EventSource reconnects by itself); at most `max_streams`
are open at once (beyond: 503 with Retry-After), and the fleet's part of a snapshot is made
once a second for all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from importlib import resources

import msgspec

from fleetgate.clock import Clock
from fleetgate.fleet.backend import REGION, BackendState
from fleetgate.fleet.gpu import GpuState
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.pool import Pool
from fleetgate.http.server import Request
from fleetgate.http.writer import ResponseWriter
from fleetgate.observe.live import LiveView, Notice, Point
from fleetgate.observe.live_regions import OTHER, RegionTraffic
from fleetgate.observe.regions import Watched
from fleetgate.observe.slo import ObjectiveStatus, SloBook
from fleetgate.observe.usage import TenantUsage, TenantUse
from fleetgate.openai_api import error_body
from fleetgate.resilience.cluster import Cluster

_ASSETS = {
    "index.html": b"text/html; charset=utf-8",
    "app.js": b"text/javascript; charset=utf-8",
    "style.css": b"text/css; charset=utf-8",
    "uPlot.iife.min.js": b"text/javascript; charset=utf-8",
    "uPlot.min.css": b"text/css; charset=utf-8",
}
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
     b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]  # fmt: skip
Handler = Callable[[Request, ResponseWriter, bytes], Awaitable[None]]
_FLAGS = tuple((flag, (flag.name or "").lower()) for flag in HealthFlag)


class Engine(msgspec.Struct):
    running: float
    waiting: float
    kv_usage: float


class GpuView(msgspec.Struct):
    state: GpuState  # stale: its agent has sent nothing for pools[].gpu.stale_after_s
    age_s: float  # since its agent's last readings


class BackendView(msgspec.Struct):
    id: str
    name: str
    role: str  # decode, or prefill for a disaggregated pool's prefill half
    verdict: str
    flags: list[str]
    in_flight: int
    in_flight_tokens: int
    pending_prefill: int
    weight: float
    speed: float
    labels: dict[str, str]
    engine: Engine | None
    ttft_s: float | None
    e2e_s: float | None
    ejected_for_s: float | None  # until an ejected backend returns
    gpu: GpuView | None  # its GPU agent's verdict (None: no agent has sent readings)


class AdmissionView(msgspec.Struct):
    in_flight: int
    waiting: int
    limit: float


class PoolView(msgspec.Struct):
    model: str
    admission: AdmissionView | None
    backends: list[BackendView]
    slo: list[ObjectiveStatus]


class LocalView(msgspec.Struct):
    """A pool's `locality` filter on the gateway's own region (routing/regions.py)."""

    model: str
    phase: str  # up, down, holding or returning
    keep: float  # the share of the pool's requests that stay in the region
    spill: float  # the share sent to the next region for saturation
    spilled: int  # requests sent out while it spilled or returned
    failovers: int
    last_failover_s: float | None  # from its first backend lost to all out (None: none yet)


class RegionView(msgspec.Struct):
    """One region: its decode backends, its traffic (observe/live.py's window) and, for the
    gateway's own, each pool's locality state."""

    region: str  # "": backends with no region label; "(other)": past the regions kept apart
    backends: int
    requests: int
    errors: int
    requests_per_s: float
    error_rate: float | None  # None: no requests
    ttft_p50: float | None
    ttft_p99: float | None
    e2e_p50: float | None
    e2e_p99: float | None
    local: list[LocalView]


class RegionsView(msgspec.Struct):
    window_s: int  # the requests' window (less in the gateway's first five minutes)
    latency_window_s: int  # the percentiles'
    regions: list[RegionView]


class Snapshot(msgspec.Struct):
    time: float
    uptime_s: float
    pools: list[PoolView]
    tenants: list[TenantUse]
    events: list[Notice]
    points: list[Point]
    regions: RegionsView


class Dashboard:
    """The dashboard's endpoints over the gateway's clusters, objectives, live view and
    tenants' use; `regions` lists each pool's locality filter (model, the gateway's region or
    "" when it knows none, its state), as the metrics read them."""

    def __init__(
        self,
        clusters: Mapping[str, Cluster],
        slo: SloBook,
        live: LiveView,
        usage: TenantUsage,
        clock: Clock,
        wall_clock: Callable[[], float] = time.time,
        interval_s: float = 1.0,
        max_stream_s: float = 600.0,
        max_streams: int = 32,
        regions: Callable[[], Iterable[Watched]] = lambda: (),
    ) -> None:
        self._clusters = clusters
        self._regions = regions
        self._slo = slo
        self._live = live
        self._usage = usage
        self._clock = clock  # the live view's interval
        self._now = clock.now
        self._wall = wall_clock
        self._interval_s = interval_s
        self._max_stream_s = max_stream_s
        self._started = clock.now()
        self._closed = asyncio.Event()
        self._max_streams = max_streams
        self._streams = 0  # live views open now
        self._made_at = -1  # the clock's second `_pools_now` and `_regions_now` were made in
        self._pools_now: list[PoolView] = []
        self._regions_now = RegionsView(0, 0, [])
        folder = resources.files("fleetgate.observe") / "dashboard"
        self._assets = {name: folder.joinpath(name).read_bytes() for name in _ASSETS}

    def routes(self) -> dict[bytes, Handler]:
        """GET paths and their handlers."""
        table: dict[bytes, Handler] = {
            b"/dashboard": self._file("index.html"),
            b"/dashboard/": self._file("index.html"),
            b"/dashboard/snapshot": self.snapshot,
            b"/dashboard/events": self.events,
            b"/dashboard/regions": self.regions,
        }
        for name in _ASSETS:
            table[b"/dashboard/" + name.encode()] = self._file(name)
        return table

    def close(self) -> None:
        """End every event stream (the gateway is draining)."""
        self._closed.set()

    def _file(self, name: str) -> Handler:
        body, kind = self._assets[name], _ASSETS[name]

        async def serve(request: Request, writer: ResponseWriter, request_id: bytes) -> None:
            headers = [(b"content-type", kind), (b"x-request-id", request_id), *SECURITY_HEADERS]
            writer.send(200, headers, body)

        return serve

    def view(self, after: int = 0) -> Snapshot:
        """The fleet now, with the seconds labelled after `after`; the fleet's part is made
        once per second of the clock, however many streams ask."""
        now = self._now()
        self._make(now)
        live = self._live
        return Snapshot(
            time=self._wall(), uptime_s=now - self._started, pools=self._pools_now,
            tenants=self._usage.tenants(), events=list(live.notices), points=live.points(after),
            regions=self._regions_now,
        )  # fmt: skip

    def regions_view(self) -> RegionsView:
        """Each region now, made with the fleet's part of the snapshot."""
        self._make(self._now())
        return self._regions_now

    def _make(self, now: float) -> None:
        if int(now) != self._made_at:
            self._made_at, self._pools_now = int(now), self._pools_view(now)
            self._regions_now = self._regions_view()

    def _regions_view(self) -> RegionsView:
        """The regions of the pools' decode backends, of the traffic in the live view's window
        and of the gateway's own (its pools' locality state); named ones first, by name."""
        backends: dict[str, int] = {}
        for cluster in self._clusters.values():
            for member in cluster.pool.states:
                region = member.backend.labels.get(REGION, "")
                backends[region] = backends.get(region, 0) + 1
        local: dict[str, list[LocalView]] = {}
        for model, region, state in self._regions():
            if region:  # a gateway that knows no region has no region of its own to show
                last = state.last_failover_s if state.failovers else None
                local.setdefault(region, []).append(LocalView(
                    model=model, phase=state.phase.value, keep=state.keep, spill=state.spill,
                    spilled=state.spilled, failovers=state.failovers, last_failover_s=last,
                ))  # fmt: skip
        window = self._live.regions()
        traffic = {t.region: t for t in window.regions}
        names = sorted({*backends, *traffic, *local}, key=lambda r: (r in ("", OTHER), r))
        rows = []
        for name in names:
            t = traffic.get(name) or RegionTraffic(name)
            rows.append(RegionView(
                region=name, backends=backends.get(name, 0), requests=t.requests,
                errors=t.errors,
                requests_per_s=t.requests / window.window_s if window.window_s else 0.0,
                error_rate=t.errors / t.requests if t.requests else None,
                ttft_p50=t.ttft_p50, ttft_p99=t.ttft_p99, e2e_p50=t.e2e_p50, e2e_p99=t.e2e_p99,
                local=local.get(name, []),
            ))  # fmt: skip
        return RegionsView(window.window_s, window.latency_window_s, rows)

    def _pools_view(self, now: float) -> list[PoolView]:
        slo = self._slo.status()
        pools = []
        for model, cluster in self._clusters.items():
            backends = [_backend(s, cluster.pool, "decode", now) for s in cluster.pool.states]
            if cluster.prefill is not None:
                prefill = cluster.prefill.router.pool
                backends += [_backend(s, prefill, "prefill", now) for s in prefill.states]
            admission = cluster.admission
            queue = None
            if admission is not None:
                queue = AdmissionView(admission.in_flight, admission.waiting, admission.limit)
            pools.append(PoolView(model, queue, backends, slo.get(model, [])))
        return pools

    async def snapshot(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        headers = [(b"content-type", b"application/json"), (b"x-request-id", request_id),
                   *SECURITY_HEADERS]  # fmt: skip
        writer.send(200, headers, msgspec.json.encode(self.view()))

    async def regions(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        headers = [(b"content-type", b"application/json"), (b"x-request-id", request_id),
                   *SECURITY_HEADERS]  # fmt: skip
        writer.send(200, headers, msgspec.json.encode(self.regions_view()))

    async def events(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        if self._streams >= self._max_streams:
            busy = [(b"content-type", b"application/json"), (b"x-request-id", request_id),
                    (b"retry-after", b"5")]  # fmt: skip
            message = f"The dashboard serves at most {self._max_streams} live views at once."
            writer.send(503, busy, error_body(503, message))
            return
        headers = [(b"content-type", b"text/event-stream"), (b"x-request-id", request_id),
                   *SECURITY_HEADERS]  # fmt: skip
        writer.start(200, headers)
        after, ends = 0, self._now() + self._max_stream_s
        self._streams += 1
        try:
            while not (self._closed.is_set() or writer.disconnected) and self._now() < ends:
                view = self.view(after)
                if view.points:
                    after = view.points[-1].t
                writer.write(b"event: snapshot\ndata: %b\n\n" % msgspec.json.encode(view))
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    await self._clock.within(self._closed.wait(), self._interval_s)
        finally:
            self._streams -= 1
            writer.end()


def _backend(state: BackendState, pool: Pool, role: str, now: float) -> BackendView:
    engine = state.engine
    latency = state.latency
    until = pool.ejected_until(state)
    gpus = state.gpus
    load = pool.board.load(state.backend.id)
    return BackendView(
        id=state.backend.id,
        name=state.backend.name,
        role=role,
        verdict=state.verdict(now).value,
        flags=[name for flag, name in _FLAGS if flag in state.flags],
        in_flight=load.in_flight,
        in_flight_tokens=load.in_flight_tokens,
        pending_prefill=load.pending_prefill,
        weight=state.weight,
        speed=state.speed,
        labels=dict(state.backend.labels),
        engine=None if engine is None else Engine(engine.running, engine.waiting, engine.kv_usage),
        ttft_s=latency.ttft_s,
        e2e_s=latency.e2e_s,
        ejected_for_s=None if until is None else max(0.0, until - now),
        gpu=None if gpus is None else GpuView(gpus.state, now - gpus.at),
    )
