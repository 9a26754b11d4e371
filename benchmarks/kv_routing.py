"""KV-cache events against the decision-based prefix index, in virtual time: does routing by
what the engines report holding keep at least the hit rate of routing by where the gateway
sent each prompt, with caches large and small?

    .venv/bin/python benchmarks/kv_routing.py [--blocks 300,1200,26875] [--seeds 3]
        [--duration 60] [--workloads shared-prefix,conversation]

One gateway's routing (the `balanced` profile's real pipeline, its load board and, with events,
its real kv_events/index.py) in front of 8 of the sim worker's engines (workers/sim/engine.py,
the h100-llama3-8b profile, each KV cache `--blocks` blocks of 16 tokens), all on one virtual
clock: each engine steps as soon as it has work, its block manager's stored and evicted blocks
reach the index 5 ms after the step that made them (one batch per step, as the sim worker
publishes them), and the engines' load is scraped every second. Nothing crosses a socket, so a
run is deterministic and takes seconds, where `scale_out.py --kv-events` spends minutes of
wall clock on the same question and its answer moves by +-10% from run to run.

Workloads (each seed draws its own):
- shared-prefix: 32 groups of questions behind a 1,500-word system prompt each, Poisson at
  `--rate` req/s (scale_out.py's shared-prefix workload at 1x);
- conversation: 120 conversations of 6 turns, 4 s apart, starting in the first half of the run,
  each whole history sent again with a new question; 4 system prompts shared among them.
The figure is the fleet's prefix-cache hit rate (the engines' own counters), with events beside
the decision-based index alone, measured in the same run, as a ratio.

What it leaves out: the network (no latency, no lost event batches), the HTTP path, several
gateways (scale_out.py measures those), and engines that are not the sim worker's.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import heapq
import itertools
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from fleetgate.chat_text import render_chat
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.engine_load import EngineLoad
from fleetgate.fleet.pool import Pool
from fleetgate.kv_events.index import EngineBlockIndex
from fleetgate.kv_events.wire import Cleared, Event, Removed, Stored
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.registry import PluginContext, default_registry
from fleetgate.tokens import token_ids
from fleetgate.workers.sim.engine import Engine, EngineRequest, StepResult
from fleetgate.workers.sim.kvcache import Pieces
from fleetgate.workers.sim.profiles import get_profile
from fleetgate.workers.sim.prompt import from_text

MODEL = "m"
BACKENDS = 8
MAX_TOKENS = 32
EVENT_LAG_S = 0.005  # from an engine step to its events in the gateway's index
SCRAPE_S = 1.0
MASK = (1 << 64) - 1  # engines publish block hashes unsigned
WORDS = [f"w{n}" for n in range(997)]  # filler text: ~1 token a word to the sim's estimate

Messages = list[dict[str, str]]


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


class Collected:
    """One engine's block events since its last step (kvcache.BlockEvents), as published."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.events: list[Event] = []

    def stored(self, hashes: Sequence[int], parent: int | None, pieces: Pieces) -> None:
        if pieces:
            unsigned = tuple(h & MASK for h in hashes)
            up = None if parent is None else parent & MASK
            self.events.append(Stored(unsigned, up, tuple(token_ids(pieces)), self.block_size))

    def removed(self, block_hash: int) -> None:
        self.events.append(Removed((block_hash & MASK,)))

    def cleared(self) -> None:
        self.events.append(Cleared())

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events


def shared_prefix(rng: random.Random, duration: float, rate: float) -> list[tuple[float, Messages]]:
    systems = [text(rng, 1500) for _ in range(32)]
    arrivals, t = [], 0.0
    while t < duration:
        question = {"role": "user", "content": text(rng, 60)}
        arrivals.append((t, [{"role": "system", "content": rng.choice(systems)}, question]))
        t += rng.expovariate(rate)
    return arrivals


def conversation(rng: random.Random, duration: float) -> list[tuple[float, Messages]]:
    systems = [text(rng, 600) for _ in range(4)]
    arrivals = []
    for n in range(120):
        start = rng.uniform(0, duration / 2)
        history = [{"role": "system", "content": systems[n % len(systems)]}]
        for turn in range(6):
            history = [*history, {"role": "user", "content": text(rng, 100)}]
            arrivals.append((start + 4.0 * turn, history))
            history = [*history, {"role": "assistant", "content": text(rng, MAX_TOKENS)}]
    return arrivals


@dataclass(order=True)
class Due:
    """Something that happens at `at` on the virtual clock."""

    at: float
    order: int
    action: Callable[[float], None] = field(compare=False)  # called with `at`


class Fleet:
    """The engines and one gateway's routing, on one virtual clock."""

    def __init__(self, blocks: int, events: bool, seed: int) -> None:
        self.profile = dataclasses.replace(get_profile("h100-llama3-8b"), num_gpu_blocks=blocks)
        bs = self.profile.block_size
        self.collected = [Collected(bs) for _ in range(BACKENDS)]
        self.engines = [Engine(self.profile, events=c) for c in self.collected]
        self.states = [BackendState(Backend(f"b{i}", f"http://127.0.0.1:{9000 + i}", (MODEL,)))
                       for i in range(BACKENDS)]  # fmt: skip
        self.pool = Pool(MODEL, self.states)
        self.index = EngineBlockIndex(1_000_000) if events else None
        ctx = PluginContext(random.Random(seed), self.pool.board, engine_blocks=self.index)
        self.pipeline = default_registry().build_pipeline("balanced", {}, ctx)
        self.busy = [False] * BACKENDS
        self.unprefilled: dict[str, int] = {}  # request id -> prompt tokens, until its first token
        self.queue: list[Due] = []
        self.order = itertools.count()

    def at(self, when: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self.queue, Due(when, next(self.order), action))

    def run(self, arrivals: list[tuple[float, Messages]]) -> float:
        """The fleet's prefix-cache hit rate over the arrivals."""
        for when, messages in arrivals:
            self.at(when, functools.partial(self.arrive, messages=messages))
        end = max(when for when, _ in arrivals)
        for k in range(int(end / SCRAPE_S) + 2):
            self.at(k * SCRAPE_S, self.scrape)
        while self.queue:
            due = heapq.heappop(self.queue)
            due.action(due.at)
        stats = [engine.stats() for engine in self.engines]
        hits = sum(s.prefix_cache_hits_tokens for s in stats)
        return hits / sum(s.prefix_cache_queries_tokens for s in stats)

    def arrive(self, now: float, messages: Messages) -> None:
        prompt = b",".join(msgspec.json.encode(m) for m in messages)
        request = RoutingRequest(MODEL, "chat", True, MAX_TOKENS, prompt=prompt)
        chosen = self.pipeline.pick(request, self.pool.candidates, now)
        assert chosen is not None
        backend = self.states.index(chosen)
        blocks = from_text(render_chat(messages), self.profile.block_size)
        request_id = f"r{next(self.order)}"
        self.unprefilled[request_id] = blocks.num_tokens
        self.pool.board.begin(chosen.backend.id, blocks.num_tokens)
        self.engines[backend].add_request(EngineRequest(request_id, blocks, MAX_TOKENS, now))
        self.step(backend, now)

    def step(self, backend: int, now: float) -> None:
        engine = self.engines[backend]
        if self.busy[backend] or not engine.has_work():
            return
        result = engine.step(now)
        events = self.collected[backend].take()
        index = self.index
        if index is not None and events:
            name = f"b{backend}"
            self.at(now + EVENT_LAG_S, lambda _: index.apply(name, events))
        self.busy[backend] = True
        self.at(now + result.duration_s, lambda at: self.stepped(at, backend, result))

    def stepped(self, now: float, backend: int, result: StepResult) -> None:
        self.busy[backend] = False
        board, name = self.pool.board, f"b{backend}"
        for request_id in result.emitted:
            tokens = self.unprefilled.pop(request_id, 0)
            if tokens:  # its first token: its prompt no longer waits for prefill
                board.prefilled(name, tokens)
        for done in result.finished:
            board.end(name, done.prompt_tokens, self.unprefilled.pop(done.request_id, 0))
        self.step(backend, now)

    def scrape(self, now: float) -> None:
        capacity = float(self.profile.num_gpu_blocks * self.profile.block_size)
        for state, engine in zip(self.states, self.engines, strict=True):
            s = engine.stats()
            state.engine = EngineLoad(
                s.num_running, s.num_waiting, s.kv_usage, s.prefix_cache_hits_tokens,
                s.prefix_cache_queries_tokens, None, now, kv_capacity_tokens=capacity,
            )  # fmt: skip


def arrivals_of(workload: str, seed: int, args: argparse.Namespace) -> list[tuple[float, Messages]]:
    rng = random.Random(7 + seed)
    if workload == "shared-prefix":
        return shared_prefix(rng, args.duration, args.rate)
    return conversation(rng, args.duration)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", default="300,1200,26875", help="KV cache sizes to compare")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=60.0, help="virtual seconds")
    parser.add_argument("--rate", type=float, default=24.0, help="shared-prefix req/s")
    parser.add_argument("--workloads", default="shared-prefix,conversation")
    args = parser.parse_args()
    print("| workload | KV blocks | decision index | KV events | events / index, each seed |")
    print("|---|---|---|---|---|")
    for workload in args.workloads.split(","):
        for blocks in (int(b) for b in args.blocks.split(",")):
            index, events = [], []
            for seed in range(args.seeds):
                arrivals = arrivals_of(workload, seed, args)
                index.append(Fleet(blocks, False, seed).run(arrivals))
                events.append(Fleet(blocks, True, seed).run(arrivals))
            ratios = ", ".join(f"{e / i:.3f}x" for e, i in zip(events, index, strict=True))
            print(f"| {workload} | {blocks:,} | {statistics.mean(index):.3f} "
                  f"| {statistics.mean(events):.3f} | {ratios} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
