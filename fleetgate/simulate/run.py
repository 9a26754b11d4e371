"""One simulation: a scenario's fleet, its gateways and its workload, run to the end on a
virtual-time loop.

Each gateway is the one `fleetgate serve` composes (serve.compose, from the scenario's config),
its transport the virtual one to the simulated replicas, its scraper reading their engine
models, its health checks and its background work on their intervals; every request goes
through its Director as one from the HTTP edge would. A client sends each request of the
workload at its time, through the network latency from its region to the gateway's, and
records what a benchmark client would: status, time to the first token, the end.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from fleetgate.bench.stats import RequestRecord
from fleetgate.clock import Clock
from fleetgate.director import Director, InferenceRequest
from fleetgate.fleet.periodic import PeriodicTasks
from fleetgate.gateway.app import RequestIds
from fleetgate.health.active import ActiveChecker
from fleetgate.lifecycle.downstream import Headers
from fleetgate.reload import Kept
from fleetgate.routing.base import RoutingRequest
from fleetgate.running import resolve
from fleetgate.serve import compose
from fleetgate.shared.state import RoutingState
from fleetgate.simulate.autoscale import SimActuator
from fleetgate.simulate.changes import FleetChanges
from fleetgate.simulate.loop import VirtualTimeLoop
from fleetgate.simulate.redis import SimRedis
from fleetgate.simulate.scenario import (
    EventSpec,
    PoolSpec,
    RegionSpec,
    Scenario,
    gateway_config,
)
from fleetgate.simulate.scraper import SimScraper
from fleetgate.simulate.transport import Fleet, VirtualTransport
from fleetgate.simulate.warp import Warp
from fleetgate.simulate.workload import SimRequest, prompt_bytes, requests
from fleetgate.traffic.door import ANONYMOUS_CALLER, Caller

PATH = b"/v1/chat/completions"
_ERROR_EVENT = b'data: {"error":'  # a stream's end that is an error (openai_api.error_event)


@dataclass
class Outcome:
    """What a simulation produced."""

    records: list[RequestRecord]
    clients: list[int]  # each record's client region, by index into the scenario's
    tenants: list[int]  # each record's tenant, by index into workload.tenants (-1: none)
    duration_s: float  # simulated seconds of sending: the workload's, or to its last request
    end_s: float  # simulated seconds until the last answer
    wall_s: float  # real seconds the run took (from `started`, when given)
    # (time, region, replicas up, GPUs up) at the start and after every change
    capacity: list[tuple[float, str, int, int]]
    events: tuple[EventSpec, ...]  # the scenario's, as they happened
    booting: list[tuple[float, float, str, int]]  # replicas starting: from, until, region, GPUs
    prefix_hit_rate: float  # prompt tokens the engines found cached, of all they looked up


@dataclass(frozen=True, slots=True)
class Entry:
    """A gateway as its clients reach it: where it is, its Director, and who each of the
    workload's tenants is to it."""

    region: str
    director: Director
    callers: list[Caller]  # by tenant index

    def caller(self, tenant: int) -> Caller:
        return ANONYMOUS_CALLER if tenant < 0 else self.callers[tenant]


class SimClient:
    """One request's client (a `Downstream`): keeps when its answer started and ended."""

    __slots__ = ("_clock", "aborted", "broke", "ended_at", "first_at", "status")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.status = 0
        self.first_at: float | None = None
        self.ended_at: float | None = None
        self.aborted = False
        self.broke = False  # the stream ended with an error event (one that could not go on)

    @property
    def disconnected(self) -> bool:
        return False

    def send(self, status: int, headers: Headers, body: bytes, lines: bytes = b"") -> None:
        self.status = status
        self.ended_at = self._clock.now()

    def start(self, status: int, headers: Headers, lines: bytes = b"") -> None:
        self.status = status

    def write(self, chunk: bytes) -> bool:
        if self.first_at is None:
            self.first_at = self._clock.now()
        self.broke = self.broke or _ERROR_EVENT in chunk
        return True

    def when_drained(self, callback: object) -> None:
        callback()  # type: ignore[operator]

    def end(self, last: bytes = b"") -> None:
        if self.first_at is None:
            self.first_at = self._clock.now()
        self.broke = self.broke or _ERROR_EVENT in last
        self.ended_at = self._clock.now()

    def abort(self) -> None:
        self.aborted = True
        self.ended_at = self._clock.now()


Progress = Callable[[float, int, int], None]  # simulated time, requests sent, answered
PROGRESS_S = 1.0  # progress is told every simulated second (and at the end)


class Simulation:
    """The scenario's fleet and gateways on one loop; `run` sends the workload through them."""

    def __init__(
        self, scenario: Scenario, loop: VirtualTimeLoop, progress: Progress | None = None
    ) -> None:
        self.scenario = scenario
        self._progress = progress
        self.sent = 0
        self._model = scenario.gateway["pools"][0]["model"]  # what every request asks for
        model = msgspec.json.encode(self._model).replace(b"%", b"%%")  # quoted, escaped
        self._body = (  # a request's body, but for its max_tokens
            b'{"model":' + model + b',"messages":[{"role":"user","content":"sim"}],'
            b'"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}'
        )
        self._over = False  # every request answered
        self._failed: BaseException | None = None  # what a request's task raised
        self._loop = loop
        self._clock = loop.clock()
        self._rng = random.Random(scenario.seed)
        self.changes = FleetChanges(scenario, loop)
        self.backends = self.changes.backends
        self._shared = Fleet(self.backends)
        self.directors: list[Entry] = []  # each gateway's
        self._nearest: dict[str, list[Entry]] = {}  # client region -> the gateways it reaches
        self._redis = SimRedis(self._clock)  # what gateways with a `state.url` share
        self.records: list[RequestRecord] = []
        self.clients: dict[int, int] = {}  # request index -> its client region
        self.tenants: dict[int, int] = {}  # request index -> its tenant
        self._tasks: set[asyncio.Task[None]] = set()  # requests not answered yet
        self._idle = asyncio.Event()
        self.last_sent = 0.0  # the workload's last send time

    def start_gateways(self) -> None:
        """Compose each gateway, its probes and scrapes started."""
        clock = self._clock
        for region in self.scenario.regions:
            for _ in range(region.gateways):
                config = gateway_config(self.scenario, region.name)
                rng = random.Random(self._rng.getrandbits(64))
                here = functools.partial(self.scenario.latency_s, region.name)
                transport = VirtualTransport(self._shared, self._loop, here)
                state = None
                if config.state.url is not None:  # shared, through the simulated Redis
                    rtt = 2 * self.scenario.latency_s(region.name, self.scenario.redis_region)
                    rtt += self.scenario.state_rtt_ms / 1000
                    state = RoutingState(
                        config.state, clock, random.Random(rng.getrandbits(64)),
                        wall_clock=clock.now, execute=self._redis.client(rtt),
                    )  # fmt: skip
                    state.start()
                kept = Kept(RequestIds(f"{region.name}{len(self.directors)}"))
                gateway, _ = compose(
                    config, resolve(config), transport=transport, clock=clock, rng=rng,
                    wall_clock=clock.now, state=state, kept=kept,
                    actuator=functools.partial(self._actuator, region.name),
                    checker=ActiveChecker(transport, clock, random.Random(rng.getrandbits(64))),
                    scraper=SimScraper(transport, clock, random.Random(rng.getrandbits(64)),
                                       self.backends),
                    background=PeriodicTasks(random.Random(rng.getrandbits(64)), clock),
                )  # fmt: skip
                door = gateway.inference.door
                callers = [
                    (door.caller_of(name) if door is not None else None) or ANONYMOUS_CALLER
                    for name in self.scenario.workload.tenants
                ]  # fmt: skip
                self.directors.append(Entry(region.name, gateway.inference.director, callers))
                assert kept.members is not None
                self.changes.members.append(kept.members)
        regions = [r.name for r in self.scenario.regions]
        for client in regions:  # a region's clients reach its gateways, else the nearest
            far = min(self.scenario.latency_s(client, e.region) for e in self.directors)
            self._nearest[client] = [
                e for e in self.directors if self.scenario.latency_s(client, e.region) == far
            ]

    def _actuator(self, region: str, model: str) -> SimActuator:
        """The actuator of a gateway in `region` for the pool of `model`: it scales the pool's
        replicas there, else in the first region that has the pool."""
        regions = self.scenario.regions
        where = next((r for r in regions if r.name == region and _has(r, model)), None)
        where = where or next((r for r in regions if _has(r, model)), regions[0])
        spec = next((p for p in where.pools if p.model == model), None)
        startup = spec.startup_s if spec is not None else PoolSpec(model=model).startup_s
        return SimActuator(self.changes, where.name, model, startup)

    async def run(self) -> float:
        """Start the gateways, send the workload, then wait for every answer; the simulated
        time it ended."""
        self.start_gateways()
        scenario = self.scenario
        regions = [r.name for r in scenario.regions]
        at: dict[float, list[EventSpec]] = {}  # events of one instant apply in the file's order
        for event in scenario.events:
            at.setdefault(event.at_s, []).append(event)
        for when, events in at.items():
            self._loop.call_at(when, self._apply, events)
        if self._progress is not None:
            self._tell()
        warp = Warp((e.at_s, e.duration_s, e.factor) for e in scenario.events if e.kind == "surge")
        clock, loop = self._clock, self._loop
        # The workload is sent for its duration of simulated time: surges play more of it.
        played = warp.played(scenario.workload.duration_s)
        settings = msgspec.structs.replace(scenario.workload, duration_s=played)
        workload = requests(settings, regions, random.Random(self._rng.getrandbits(64)))
        for index, request in enumerate(workload):
            sent = warp.at(request.at_s)
            wait = sent - loop.time()
            if wait > 0:
                await clock.sleep(wait)
            self.last_sent = sent
            self.sent += 1
            task = loop.create_task(self._send(index, request, sent, regions[request.client]))
            self._tasks.add(task)
            task.add_done_callback(self._answered)
        while self._tasks:
            self._idle.clear()
            await self._idle.wait()
            self._raise_failed()
        self._raise_failed()
        self._over = True
        if self._progress is not None:
            self._progress(loop.time(), self.sent, len(self.records))
        return loop.time()

    def _apply(self, events: list[EventSpec]) -> None:
        for event in events:
            self.changes.apply(event)

    def _tell(self) -> None:
        """Tell the progress now, and again in PROGRESS_S until the run is over."""
        assert self._progress is not None
        self._progress(self._loop.time(), self.sent, len(self.records))
        if not self._over:
            self._loop.call_later(PROGRESS_S, self._tell)

    def _gateway(self, region: str, index: int) -> Entry:
        """The gateway a client in `region` reaches: one of the nearest, in turn (as a load
        balancer in front of them spreads connections)."""
        nearest = self._nearest[region]
        return nearest[index % len(nearest)]

    async def _send(self, index: int, request: SimRequest, sent: float, region: str) -> None:
        clock = self._clock
        entry = self._gateway(region, index)
        where, director = entry.region, entry.director
        hop = self.scenario.latency_s(region, where)
        if hop:
            await clock.sleep(hop)
        request_id = b"%d" % index
        now = clock.now()
        self._shared.expect(request_id, request)
        model = self._model
        body = self._body % request.output_tokens
        routing = RoutingRequest(model, "chat", True, request.output_tokens,
                                 prompt=prompt_bytes(request))  # fmt: skip
        client = SimClient(clock)
        director.received(request_id, now, PATH)
        try:
            await director.run(
                InferenceRequest(request_id=request_id, started=now, path=PATH, routing=routing,
                                 body=body, caller=entry.caller(request.tenant)),
                client,
            )  # fmt: skip
        finally:
            self._shared.done(request_id)
        self._record(index, request, client, (sent, hop))

    def _raise_failed(self) -> None:
        """A gateway that raised on a request (a bug: it answers errors, it never raises) ends
        the run with that exception, rather than the request missing from the report."""
        if self._failed is not None:
            raise self._failed

    def _answered(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._failed = self._failed or task.exception()
            self._idle.set()
        if not self._tasks:
            self._idle.set()

    def _record(
        self, index: int, request: SimRequest, client: SimClient, times: tuple[float, float]
    ) -> None:
        sent, hop = times  # when the client sent it, the network's time to the gateway
        end = (client.ended_at or self._clock.now()) + hop
        error = None
        if client.aborted:
            error = "aborted"
        elif client.broke:  # as `fleetgate bench` counts it
            error = "stream_error"
        elif client.status != 200:
            error = f"http_{client.status}"
        first = None if client.first_at is None else client.first_at + hop
        ttft = None if first is None else first - sent
        self.records.append(
            RequestRecord(
                index=index, scheduled_s=sent, sent_s=sent, prompt_tokens=request.prompt_tokens,
                output_tokens=request.output_tokens if error is None else 0, error=error,
                ttft_s=ttft, itl_s=array("d", [] if first is None else [end - first]),
                e2e_s=end - sent,
            )
        )  # fmt: skip
        self.clients[index] = request.client
        self.tenants[index] = request.tenant


def _has(region: RegionSpec, model: str) -> bool:
    return any(p.model == model for p in region.pools)


def simulate(
    scenario: Scenario, started: float | None = None, progress: Progress | None = None
) -> Outcome:
    """Run `scenario` to its end; `started`: when the run began on time.perf_counter (the
    command's start), else now; `progress` is told how far it got now and then."""
    started = time.perf_counter() if started is None else started
    # The Runner cancels what is still running at the end (probes, scrapes) before it closes.
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(io=False)) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, VirtualTimeLoop)
        simulation = Simulation(scenario, loop, progress)
        end = runner.run(simulation.run())
    records = sorted(simulation.records, key=lambda r: r.index)
    clients = [simulation.clients[r.index] for r in records]
    tenants = [simulation.tenants[r.index] for r in records]
    sending = min(scenario.workload.duration_s, max(simulation.last_sent, 1e-9))
    wall = time.perf_counter() - started
    return Outcome(
        records=records, clients=clients, tenants=tenants, duration_s=sending, end_s=end,
        wall_s=wall, capacity=simulation.changes.capacity, events=scenario.events,
        booting=simulation.changes.booting,
        prefix_hit_rate=simulation.changes.prefix_hit_rate(),
    )  # fmt: skip
