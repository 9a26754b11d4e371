"""A pool of the built-in fleet replayed in virtual time, for tests of what the gateway learns
from its engines (tests/fleet/test_calibration.py).

The sim's engines with the pool's profiles and their /metrics, as `fleetgate serve` starts them,
and the gateway's own pool, router (the pool's policy) and scraper, driven by one queue of
events: a request arrives, is routed and queued in its engine; an engine's step ends after the
time its profile gives, and its tokens are published as the sim worker's driver publishes them
(workers/sim/driver.py: the inter-token gap is the time since the last published step); each
backend is scraped on its jittered interval through a mock transport that serves its worker's
/metrics. Nothing sleeps: 200 requests take about a second.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from fleetgate.clock import LoopClock
from fleetgate.config import PoolConfig
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.pool import Pool
from fleetgate.fleet.scraper import MetricsScraper
from fleetgate.http.mock import MockTransport, Script, Sent
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.registry import PluginContext, default_registry
from fleetgate.routing.router import Router
from fleetgate.workers.sim.engine import Engine, EngineRequest, StepResult
from fleetgate.workers.sim.metrics import WorkerMetrics
from fleetgate.workers.sim.profiles import get_profile
from fleetgate.workers.sim.prompt import synthetic


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of the replay."""

    at_s: float
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Routed:
    """A request as routed: where it went, and every backend's effective weight then (those of
    the last recalibration, which the pick applied if one was due)."""

    request: int
    at_s: float
    backend: int  # its index in the pool's backends
    weights: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Replay:
    """What a replay saw."""

    routed: list[Routed]
    e2e_s: list[list[float]]  # by backend, each finished request's arrival to last token


class _Event(IntEnum):
    # At one instant a step ends before a scrape reads it, and both before a new arrival.
    STEP_END = 0
    SCRAPE = 1
    ARRIVE = 2


class _Replica:
    """One sim worker: its engine and /metrics, and the step in flight."""

    __slots__ = ("engine", "metrics", "published_s", "state", "step")

    def __init__(self, state: BackendState, profile: str, priority: bool) -> None:
        self.state = state
        self.engine = Engine(get_profile(profile), priority)
        p = self.engine.profile
        self.metrics = WorkerMetrics(self.engine, "m", p.block_size, p.num_gpu_blocks)
        self.step: StepResult | None = None
        self.published_s = 0.0  # when its last step's tokens were published


async def replay_pool(config: PoolConfig, arrivals: Sequence[Arrival], seed: int) -> Replay:
    """Route `arrivals` over `config`'s sim backends until every request has finished."""
    return await _PoolReplay(config, seed).run(arrivals)


class _PoolReplay:
    def __init__(self, config: PoolConfig, seed: int) -> None:
        self.config = config
        self.rng = random.Random(seed)
        self.clock = 0.0
        self.replicas: list[_Replica] = []
        for i, backend in enumerate(config.backends):
            assert backend.sim is not None, "a replayed pool is made of sims"
            url = f"http://127.0.0.1:{9000 + i}"
            state = BackendState(Backend(url[7:], url, (config.model,), engine="vllm"))
            self.replicas.append(_Replica(state, backend.sim, config.engine_priority))
        self.index = {r.state: i for i, r in enumerate(self.replicas)}
        by_port = {r.state.backend.origin.port: r for r in self.replicas}

        def metrics(sent: Sent) -> Script:
            return Script(200, chunks=[by_port[sent.origin.port].metrics.render()])

        self.scraper = MetricsScraper(
            MockTransport(metrics), LoopClock(lambda: self.clock), self.rng
        )
        self.pool = Pool(
            config.model, [r.state for r in self.replicas], config.health(), config.weights
        )
        ctx = PluginContext(
            random.Random(seed), self.pool.board, config.engine_metrics.stale_after_s
        )
        pipeline = default_registry().build_pipeline(config.policy, config.policy_params, ctx)
        self.router = Router(self.pool, pipeline)
        self.events: list[tuple[float, _Event, int, int]] = []  # (when, kind, order, index)
        self.order = itertools.count()
        self.routed: list[Routed] = []
        self.e2e_s: list[list[float]] = [[] for _ in self.replicas]
        self.sent_to: dict[str, tuple[int, int]] = {}  # request id: (replica, prompt tokens)
        self.prefilling: set[str] = set()  # sent, no first token yet

    async def run(self, arrivals: Sequence[Arrival]) -> Replay:
        for i, arrival in enumerate(arrivals):
            self.at(arrival.at_s, _Event.ARRIVE, i)
        for i in range(len(self.replicas)):
            self.at(self.rng.uniform(0.0, self.config.engine_metrics.interval_s), _Event.SCRAPE, i)
        while self.sent_to or len(self.routed) < len(arrivals):
            self.clock, kind, _, index = heapq.heappop(self.events)
            if kind is _Event.ARRIVE:
                self.arrive(index, arrivals[index])
            elif kind is _Event.STEP_END:
                self.step_ended(index)
            else:
                await self.scrape(index)
        return Replay(self.routed, self.e2e_s)

    def at(self, when: float, kind: _Event, index: int) -> None:
        heapq.heappush(self.events, (when, kind, next(self.order), index))

    def arrive(self, number: int, arrival: Arrival) -> None:
        """Route the request, as the gateway's lifecycle counts it, and queue it in its engine."""
        # A distinct prompt of the arrival's length (bytes / 4 tokens, as routing estimates).
        prompt = f"{number:08d}".encode().ljust(4 * arrival.prompt_tokens, b".")
        request = RoutingRequest(
            self.config.model, "chat", True, max_tokens=arrival.max_tokens, prompt=prompt
        )
        picked = self.router.pick(request, self.clock)
        assert picked is not None
        r = self.index[picked]
        weights = tuple(s.weight for s in self.pool.states)
        self.routed.append(Routed(number, self.clock, r, weights))
        self.pool.begin(picked.backend.id, self.clock, request.prompt_tokens)
        request_id = f"r{number}"
        self.sent_to[request_id] = (r, request.prompt_tokens)
        self.prefilling.add(request_id)
        replica = self.replicas[r]
        blocks = synthetic(arrival.prompt_tokens, replica.engine.profile.block_size, number)
        replica.engine.add_request(
            EngineRequest(request_id, blocks, arrival.max_tokens, self.clock)
        )
        if replica.step is None:  # it was idle: it wakes, as the driver's loop does
            replica.published_s = self.clock
            self.start_step(r)

    def start_step(self, r: int) -> None:
        replica = self.replicas[r]
        replica.step = replica.engine.step(self.clock)
        self.at(self.clock + replica.step.duration_s, _Event.STEP_END, r)

    def step_ended(self, r: int) -> None:
        """Publish the step's tokens, as the sim worker's driver does, and start the next."""
        replica, now = self.replicas[r], self.clock
        step = replica.step
        assert step is not None
        if step.tokens:
            decodes = len(step.emitted) - step.first_tokens
            replica.metrics.steps.step(step.tokens, decodes, now - replica.published_s, 0.0)
            replica.published_s = now
        for request_id in step.emitted:
            if request_id in self.prefilling:
                self.prefilling.discard(request_id)
                self.pool.board.prefilled(replica.state.backend.id, self.sent_to[request_id][1])
        for info in step.finished:
            _, tokens = self.sent_to.pop(info.request_id)
            self.pool.end(replica.state.backend.id, now, tokens)
            replica.metrics.finished(info)
            self.e2e_s[r].append(info.finish_s - info.arrival_s)
        replica.step = None
        if replica.engine.has_work():
            self.start_step(r)

    async def scrape(self, r: int) -> None:
        settings = self.config.engine_metrics
        await self.scraper.scrape(self.replicas[r].state, settings, self.pool.board)
        jitter = self.rng.uniform(1 - settings.jitter, 1 + settings.jitter)
        self.at(self.clock + settings.interval_s * jitter, _Event.SCRAPE, r)
