"""Routing policies side by side in virtual time: the gateway's real routing over the sim
worker's engines on one clock, no sockets, deterministic, in seconds of wall time.

    .venv/bin/python benchmarks/virtual_routing.py [--workloads code-completion,azure-conv]
        [--policies round_robin,least_requests,balanced,scorer:slo] [--rates 30,32]
        [--duration 150] [--seeds 2] [--burst-size 8] [--burst-spread 1]

What runs is what routes in the gateway: a pool (its load board, calibrated weights), its
router and the policy's pipeline from the plugin registry (a policy by name, or `scorer:NAME`:
that one scorer alone, with the benchmark's SLO as its objectives). In front of it, the
workload's fleet of the sim worker's engines (workers/sim/engine.py: 8 H100s, or 4 H100s and
4 A100s for mixed-azure-conv), each stepping as soon as it has work, time-dilated by --slowdown
as benchmarks/routing.py runs them, so figures compare with its tables; engines are scraped
every second (their load and step totals: the weights calibrate from them as in the gateway)
and each answer's latency is recorded as the gateway's fleet accounting records it. The
workloads are `fleetgate bench`'s own (fleetgate/bench/config.py), sent open-loop, each seed
drawing its own.

Per policy: TTFT p50/p90/p99, TPOT p90, the share of requests meeting the goodput SLO (TTFT
<= 2 s and TPOT <= 200 ms, as benchmarks/routing.py's) and the tight one (TTFT <= 1 s), and
goodput (requests meeting the SLO per second of sending), each beside least_requests' (a
ratio). benchmarks/routing.py measures the same end to end (HTTP, processes, the load
generator), where runs move by +-10%; this is where a routing idea is tried first.

What it leaves out: the network, the HTTP path, the gateway's own time, engines that are not
the sim worker's, and other clients.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import itertools
import random
import statistics
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from fleetgate.bench.config import BenchConfig, WorkloadName, build_workload
from fleetgate.bench.stats import RequestRecord, Slo, Summary, summarize
from fleetgate.bench.workloads import Bursts, PoissonArrivals, RequestSpec
from fleetgate.chat_text import render_chat
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.engine_load import EngineLoad, StepTotals
from fleetgate.fleet.pool import Pool
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.pipeline import RoutingPipeline
from fleetgate.routing.registry import PluginContext, Profile, default_registry
from fleetgate.routing.router import Router
from fleetgate.workers.sim.engine import Engine, EngineRequest, StepResult
from fleetgate.workers.sim.profiles import get_profile
from fleetgate.workers.sim.prompt import from_text

MODEL = "m"
SCRAPE_S = 1.0
SLO = Slo(ttft_ms=2000.0, itl_ms=200.0)
TIGHT = Slo(ttft_ms=1000.0, itl_ms=200.0)
H100 = "h100-llama3-8b"


@dataclass(frozen=True)
class Workload:
    bench: WorkloadName  # `fleetgate bench`'s workload
    fleet: tuple[tuple[str, int], ...]  # (sim profile, replicas)
    rate: float  # req/s when --rates gives none (routing.py's, or near its capacity)


WORKLOADS = {
    "code-completion": Workload("code-completion", ((H100, 8),), 30.0),
    "azure-conv": Workload("azure-conv", ((H100, 8),), 32.0),
    "mixed-azure-conv": Workload("azure-conv", ((H100, 4), ("a100-llama3-8b", 4)), 26.0),
}


@dataclass(order=True)
class Due:
    """Something that happens at `at` on the virtual clock."""

    at: float
    order: int
    action: Callable[[float], None] = field(compare=False)  # called with `at`


@dataclass
class Flight:
    """One request on its way: when it was sent, its first token, its backend."""

    spec: RequestSpec
    index: int
    backend: int
    estimate: int  # the gateway's prompt-token estimate, as the load board counts it
    queued: int  # prompt tokens waiting for prefill there when it was sent
    first_s: float | None = None


class VirtualFleet:
    """The engines and one gateway's routing, on one virtual clock."""

    def __init__(
        self, policy: str, fleet: Sequence[tuple[str, int]], seed: int, slowdown: float
    ) -> None:
        profiles = [get_profile(name) for name, count in fleet for _ in range(count)]
        self.slowdown = slowdown
        self.engines = [Engine(p) for p in profiles]
        self.capacity = [float(p.num_gpu_blocks * p.block_size) for p in profiles]
        self.states = [BackendState(Backend(f"b{i}", f"http://127.0.0.1:{9000 + i}", (MODEL,)))
                       for i in range(len(profiles))]  # fmt: skip
        self.pool = Pool(MODEL, self.states)
        ctx = PluginContext(random.Random(seed), self.pool.board)
        self.router = Router(self.pool, pipeline(policy, ctx))
        self.totals = [[0.0] * 4 for _ in profiles]  # steps, tokens, gaps, gap seconds
        self.busy = [False] * len(profiles)
        self.flights: dict[str, Flight] = {}
        self.records: list[RequestRecord] = []
        self.queue: list[Due] = []
        self.order = itertools.count()

    def at(self, when: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self.queue, Due(when, next(self.order), action))

    def run(self, specs: Iterable[RequestSpec], duration_s: float) -> list[RequestRecord]:
        for index, spec in enumerate(specs):
            self.at(spec.at_s, functools.partial(self.send, spec=spec, index=index))
        for k in range(int(duration_s / SCRAPE_S) + 1):
            self.at(k * SCRAPE_S, self.scrape)
        while self.queue:
            due = heapq.heappop(self.queue)
            due.action(due.at)
        return sorted(self.records, key=lambda r: r.index)

    def send(self, now: float, spec: RequestSpec, index: int) -> None:
        messages = [{"role": m.role, "content": m.content} for m in spec.messages]
        prompt = b",".join(msgspec.json.encode(m) for m in messages)
        request = RoutingRequest(MODEL, "chat", True, spec.max_tokens, prompt=prompt)
        chosen = self.router.pick(request, now)
        assert chosen is not None
        backend = self.states.index(chosen)
        engine = self.engines[backend]
        blocks = from_text(render_chat(messages), engine.profile.block_size)
        request_id = f"r{index}"
        queued = self.pool.board.load(chosen.backend.id).pending_prefill
        self.flights[request_id] = Flight(spec, index, backend, request.prompt_tokens, queued)
        self.pool.begin(chosen.backend.id, now, request.prompt_tokens)
        engine.add_request(EngineRequest(request_id, blocks, spec.max_tokens, now))
        self.step(backend, now)

    def step(self, backend: int, now: float) -> None:
        engine = self.engines[backend]
        if self.busy[backend] or not engine.has_work():
            return
        result = engine.step(now)
        self.busy[backend] = True
        self.at(
            now + result.duration_s * self.slowdown, lambda at: self.stepped(at, backend, result)
        )

    def stepped(self, now: float, backend: int, result: StepResult) -> None:
        self.busy[backend] = False
        totals = self.totals[backend]
        gaps = len(result.emitted) - result.first_tokens
        totals[0] += 1
        totals[1] += result.tokens
        totals[2] += gaps
        totals[3] += gaps * result.duration_s * self.slowdown
        name = f"b{backend}"
        for request_id in result.emitted:
            flight = self.flights.get(request_id)
            if flight is not None and flight.first_s is None:
                flight.first_s = now
                self.pool.board.prefilled(name, flight.estimate)
        for done in result.finished:
            flight = self.flights.pop(done.request_id)
            self.pool.end(name, now, flight.estimate, 0)
            assert flight.first_s is not None
            sent = flight.spec.at_s
            self.states[backend].latency.record_stream(
                flight.first_s - sent, now - sent, done.output_tokens,
                flight.queued + flight.estimate,
            )  # fmt: skip
            self.records.append(self._record(flight, now, done.output_tokens))
        self.step(backend, now)

    def _record(self, flight: Flight, now: float, output_tokens: int) -> RequestRecord:
        sent, first = flight.spec.at_s, flight.first_s
        assert first is not None
        return RequestRecord(
            flight.index, sent, sent, flight.spec.prompt_tokens, output_tokens,
            ttft_s=first - sent, itl_s=array("d", [now - first]), e2e_s=now - sent,
        )  # fmt: skip

    def scrape(self, now: float) -> None:
        for i, (state, engine) in enumerate(zip(self.states, self.engines, strict=True)):
            s = engine.stats()
            totals = StepTotals(*self.totals[i])
            state.engine = EngineLoad(
                s.num_running, s.num_waiting, s.kv_usage, s.prefix_cache_hits_tokens,
                s.prefix_cache_queries_tokens, None, now, kv_capacity_tokens=self.capacity[i],
                sent_tokens=self.pool.board.load(state.backend.id).in_flight_tokens,
                step_totals=totals,
            )  # fmt: skip
            state.step_fit.add(totals)


def pipeline(policy: str, ctx: PluginContext) -> RoutingPipeline:
    """A policy by name, or `scorer:NAME`: a profile of that one scorer."""
    registry = default_registry()
    if policy.startswith("scorer:"):
        return registry.build_profile(Profile.of((policy.split(":", 1)[1], 1)), ctx)
    return registry.build_pipeline(policy, {}, ctx)


def run_policy(
    workload: str, policy: str, rate: float, seed: int, args: argparse.Namespace
) -> tuple[Summary, float]:
    """The run's summary under the goodput SLO, and its attainment of the tight one."""
    arrivals = (
        Bursts(rate, args.burst_size, args.burst_spread)
        if workload == "code-completion"
        else PoissonArrivals(rate)
    )
    shape = WORKLOADS[workload]
    config = BenchConfig(
        target="http://127.0.0.1:1", workload=shape.bench, arrivals=arrivals,
        duration_s=args.duration, seed=seed,
    )  # fmt: skip
    specs = list(build_workload(config, random.Random(seed)))
    fleet = VirtualFleet(policy, shape.fleet, seed, args.slowdown)
    records = fleet.run(specs, args.duration)
    tight = summarize(records, args.duration, TIGHT).slo_attainment or 0.0
    return summarize(records, args.duration, SLO), tight


def figures(summary: Summary, records_slo: float) -> list[float]:
    ttft, tpot = summary.ttft_ms, summary.tpot_ms
    assert ttft is not None and tpot is not None
    return [
        ttft.p50, ttft.p90, ttft.p99, tpot.p90, (summary.slo_attainment or 0.0) * 100,
        records_slo * 100, summary.goodput or 0.0,
    ]  # fmt: skip


HEADER = ["policy", "TTFT p50", "p90", "p99", "TPOT p90", "SLO %", "tight SLO %", "goodput"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="code-completion,azure-conv")
    parser.add_argument("--policies", default="round_robin,least_requests,balanced")
    parser.add_argument("--rates", default="", help="req/s, one per workload (default: theirs)")
    parser.add_argument("--duration", type=float, default=150.0, help="virtual seconds")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--slowdown", type=float, default=4.0)
    parser.add_argument("--burst-size", type=float, default=8.0)
    parser.add_argument("--burst-spread", type=float, default=1.0)
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    rates = (
        [float(r) for r in args.rates.split(",")]
        if args.rates
        else [WORKLOADS[w].rate for w in workloads]
    )
    for workload, rate in zip(workloads, rates, strict=True):
        rows: dict[str, list[float]] = {}
        for policy in args.policies.split(","):
            per_seed = []
            for seed in range(args.seeds):
                summary, tight = run_policy(workload, policy, rate, seed, args)
                per_seed.append(figures(summary, tight))
            rows[policy] = [statistics.mean(v) for v in zip(*per_seed, strict=True)]
        _print(f"{workload} @ {rate:g} req/s, {args.seeds} seeds", rows)
    return 0


def _print(title: str, rows: dict[str, list[float]]) -> None:
    base = rows.get("least_requests")
    print(f"\n== {title} (ratios to least_requests) ==")
    print(" | ".join(HEADER))
    for policy, values in rows.items():
        cells = [policy]
        for i, v in enumerate(values):
            ratio = (
                f" ({v / base[i]:.2f}x)" if base and base[i] and policy != "least_requests" else ""
            )
            cells.append(f"{v:,.1f}{ratio}")
        print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
