"""Several gateways on one Redis against one: does routing stay as good when the load is spread
over 1, 2 and 4 gateway processes, each sharing its state (`state.url`)?

    .venv/bin/python benchmarks/scale_out.py [--gateways 1,2,4] [--duration 40]
        [--slowdown 4] [--workloads shared-prefix,conversation] [--unshared]

For each workload and each gateway count, a fresh fleet of 8 sim workers (no count inherits
another's warm caches), a fresh Redis, and N `fleetgate serve` processes on it; the load is
sent round robin over the gateways, request by request, so consecutive turns of a
conversation reach different gateways (the case per-process state gets wrong):
- shared-prefix: 32 groups of questions behind a long system prompt each (SGLang's generated
  shared-prefix benchmark, smaller), Poisson arrivals;
- conversation: 24 conversations of 6 turns, each turn the whole conversation so far and a new
  question, a few seconds apart.
Per run: the fleet's prefix-cache hit rate (the engines' own counters), the follow-up hit rate
(cached / prompt tokens of the conversation's turns after the first, from each answer's
usage), TTFT p90, load imbalance (the coefficient of variation of in-flight requests over the
backends, the engines' running + waiting, sampled every 0.25 s under load, and of the
requests each backend served over the run), and each
gateway's view of the fleet's in flight against the truth (its load board's sum over the
backends against the engines' running + waiting, sampled at the same time): the mean
relative error. `--kill-redis` kills Redis a third into each shared run and starts it again
(empty) at two thirds: the failed requests, and how long after its return every gateway's
shared parts are up again. Each figure is printed beside the one-gateway run's, measured in the same
invocation, as a ratio. `--unshared` runs the gateways without Redis too, for contrast.

The machine has 2 cores: sim workers run `--slowdown` times slower than the GPU they model,
and the offered rates are scaled to match; each run records the CPU idle share, and a run
where it fell under 10% is marked SATURATED (the machine, not the fleet, was the bottleneck).
`--kv-events` adds, for each count, a run whose sim workers publish their KV-cache events and
whose gateways route by them (still sharing the rest through Redis).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from harness import (
    PY,
    Redis,
    cpu_times,
    drain,
    gateway,
    get,
    metric,
    process,
    read_until,
    redis_server,
    wait_http,
)

MODEL = "scale-8b"
BACKENDS = 8
WORDS = [f"w{n}" for n in range(997)]  # filler text: ~1 token a word to the sim's estimate


@dataclass
class Run:
    """What one run measured."""

    ttfts: list[float] = field(default_factory=list)
    follow_ups: list[tuple[int, int]] = field(default_factory=list)  # (cached, prompt) tokens
    failed: int = 0
    imbalance: list[float] = field(default_factory=list)  # CV of in-flight over backends
    view_error: list[float] = field(default_factory=list)  # |view - truth| / truth
    idle: list[float] = field(default_factory=list)


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


@contextmanager
def sims(slowdown: float, kv_events: bool, blocks: int | None) -> Iterator[list[dict[str, Any]]]:
    """The fleet, as the gateways' config lists its backends."""
    args = [PY, "-m", "fleetgate", "worker", "sim", "--port", "0", "--model", MODEL,
            "--replicas", str(BACKENDS), "--slowdown", str(slowdown),
            *(["--kv-events-port", "0"] if kv_events else []),
            *(["--num-gpu-blocks-override", str(blocks)] if blocks else [])]  # fmt: skip
    said = r"on (http://127\.0\.0\.1:\d+)(?:, KV events on (\S+) \(replay (\S+)\))?"
    with process(args) as proc:
        found = [read_until(proc, said) for _ in range(BACKENDS)]
        drain(proc)
        backends: list[dict[str, Any]] = []
        for m in found:
            wait_http(m.group(1) + "/health")
            events = {"endpoint": m.group(2), "replay_endpoint": m.group(3)}
            backends.append({"url": m.group(1), **({"kv_events": events} if kv_events else {})})
        yield backends


@contextmanager
def gateways(count: int, backends: list[dict[str, Any]], redis: str | None, workdir: Path,
             syncs: dict[str, float]) -> Iterator[list[str]]:  # fmt: skip
    config = workdir / "gw.yaml"
    state = {"state": {"url": redis, **syncs}} if redis is not None else {}
    config.write_text(json.dumps({
        "pools": [{"model": MODEL, "backends": backends}],
        "request_log": {"enabled": False}, **state,
    }))  # fmt: skip
    with ExitStack() as stack:
        yield [stack.enter_context(gateway(config))[0] for _ in range(count)]


async def ask(client: openai.AsyncOpenAI, messages: list[dict[str, str]], run: Run,
              max_tokens: int) -> tuple[str, int, int]:  # fmt: skip
    """One streamed chat request: its answer, prompt and cached tokens; its TTFT in `run`."""
    sent = time.monotonic()
    answer, prompt, cached, first = [], 0, 0, None
    try:
        stream = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=max_tokens, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        )  # fmt: skip
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if first is None:
                    first = time.monotonic() - sent
                answer.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                prompt = chunk.usage.prompt_tokens
                details = chunk.usage.prompt_tokens_details
                cached = (details.cached_tokens or 0) if details is not None else 0
    except openai.APIError:
        run.failed += 1
        return "", 0, 0
    if first is not None:
        run.ttfts.append(first)
    return "".join(answer), prompt, cached


async def shared_prefix(clients: list[openai.AsyncOpenAI], rate: float, duration: float,
                        run: Run) -> None:  # fmt: skip
    rng = random.Random(7)
    systems = [text(rng, 1500) for _ in range(32)]
    tasks, n, end = [], 0, time.monotonic() + duration
    while time.monotonic() < end:
        messages = [{"role": "system", "content": rng.choice(systems)},
                    {"role": "user", "content": text(rng, 60)}]  # fmt: skip
        tasks.append(asyncio.create_task(ask(clients[n % len(clients)], messages, run, 32)))
        n += 1
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)


async def conversations(clients: list[openai.AsyncOpenAI], duration: float, run: Run) -> None:
    rng = random.Random(11)
    turn = [0]  # requests sent, over every conversation: round robin over the gateways

    async def one(n: int) -> None:
        await asyncio.sleep(rng.uniform(0, duration / 3))
        messages = [{"role": "system", "content": text(rng, 800)}]
        for k in range(6):
            messages.append({"role": "user", "content": text(rng, 80)})
            client = clients[turn[0] % len(clients)]
            turn[0] += 1
            answer, prompt, cached = await ask(client, messages, run, 48)
            if k and prompt:
                run.follow_ups.append((cached, prompt))
            messages.append({"role": "assistant", "content": answer or "ok"})
            await asyncio.sleep(rng.uniform(1.0, 3.0))

    await asyncio.gather(*(one(n) for n in range(24)))


async def send(workload: str, gws: list[str], args: argparse.Namespace, run: Run) -> None:
    """The workload, round robin over the gateways `gws`."""
    clients = [openai.AsyncOpenAI(base_url=g + "/v1", api_key="none", max_retries=0,
                                  timeout=120) for g in gws]  # fmt: skip
    try:
        if workload == "shared-prefix":
            await shared_prefix(clients, args.rate / args.slowdown, args.duration, run)
        else:
            await conversations(clients, args.duration, run)
    finally:
        for client in clients:
            await client.close()


def sample(urls: list[str], gws: list[str], stop: threading.Event, run: Run) -> None:
    """Every 0.25 s: the engines' in flight, its spread, and each gateway's view of it."""
    idle0, total0 = cpu_times()
    with ThreadPoolExecutor(len(urls) + len(gws)) as pool:
        while not stop.wait(0.25):
            idle1, total1 = cpu_times()
            if total1 > total0:
                run.idle.append((idle1 - idle0) / (total1 - total0))
            idle0, total0 = idle1, total1
            try:  # every page at once: the figures compared are of one moment
                pages = list(pool.map(lambda url: get(url + "/metrics", 2.0), [*urls, *gws]))
            except OSError:
                continue
            truth = [
                metric(page, "vllm:num_requests_running")
                + metric(page, "vllm:num_requests_waiting")
                for page in pages[: len(urls)]
            ]
            views = [
                metric(page, "fleetgate_backend_in_flight_requests") for page in pages[len(urls) :]
            ]
            total = sum(truth)
            if total >= 4:  # under load: a spread over an idle fleet says nothing
                run.imbalance.append(statistics.pstdev(truth) / (total / len(truth)))
                run.view_error.extend(abs(view - total) / total for view in views)


def engine_totals(urls: list[str]) -> tuple[float, float]:
    """The fleet's prefix-cache hit rate, and the coefficient of variation of the requests
    each backend served (the fleet is fresh: its counters are the run's)."""
    hits = queries = 0.0
    served = []
    for url in urls:
        page = get(url + "/metrics")
        hits += metric(page, "vllm:prefix_cache_hits_total")
        queries += metric(page, "vllm:prefix_cache_queries_total")
        served.append(metric(page, "vllm:request_success_total"))
    mean = statistics.mean(served)
    return hits / queries if queries else 0.0, statistics.pstdev(served) / mean if mean else 0.0


def outage(redis: Redis, gws: list[str], duration: float, done: dict[str, float]) -> None:
    """Kill Redis a third into the sending and start it again (empty) at two thirds; then
    how long until every gateway's shared parts are up again."""
    time.sleep(duration / 3)
    redis.kill()
    time.sleep(duration / 3)
    redis.start()
    back = time.monotonic()
    while time.monotonic() - back < 30:
        pages = [get(g + "/metrics", 2.0) for g in gws]
        parts = [line for page in pages for line in page.splitlines()
                 if line.startswith("fleetgate_shared_state_up{")]  # fmt: skip
        if parts and all(line.endswith(" 1.0") for line in parts):
            done["converged_s"] = time.monotonic() - back
            return
        time.sleep(0.05)


def run_one(
    workload: str, count: int, shared: bool, args: argparse.Namespace, kv_events: bool = False
) -> dict[str, Any]:
    run = Run()
    converged: dict[str, float] = {}
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        redis = stack.enter_context(redis_server()) if shared else None
        backends = stack.enter_context(sims(args.slowdown, kv_events, args.num_gpu_blocks))
        urls = [b["url"] for b in backends]
        syncs = {"sync_s": args.sync_s, "load_sync_s": args.load_sync_s}
        url = None if redis is None else redis.url
        gws = stack.enter_context(gateways(count, backends, url, workdir, syncs))
        stop = threading.Event()
        sampler = threading.Thread(target=sample, args=(urls, gws, stop, run), daemon=True)
        sampler.start()
        killer = None
        if redis is not None and args.kill_redis:
            killer = threading.Thread(
                target=outage, args=(redis, gws, args.duration, converged), daemon=True
            )
            killer.start()
        asyncio.run(send(workload, gws, args, run))
        if killer is not None:
            killer.join()
        stop.set()
        sampler.join()
        hits, served_cv = engine_totals(urls)
    ttfts = sorted(run.ttfts)
    cached = sum(c for c, _ in run.follow_ups)
    prompt = sum(p for _, p in run.follow_ups)
    idle = sorted(run.idle)
    return {
        "requests": len(ttfts) + run.failed,
        "failed": run.failed,
        "hit_rate": hits,
        "follow_up_hit_rate": cached / prompt if prompt else None,
        "ttft_p90_ms": ttfts[int(len(ttfts) * 0.9)] * 1e3 if ttfts else None,
        "imbalance_cv": statistics.mean(run.imbalance) if run.imbalance else None,
        "served_cv": served_cv,
        "view_error": statistics.mean(run.view_error) if run.view_error else None,
        "idle_p10": idle[len(idle) // 10] if idle else 1.0,
        "converged_s": converged.get("converged_s"),
    }


def show(workload: str, results: dict[str, dict[str, Any]]) -> None:
    base = results.get("1 gateway")
    print(f"\n{workload}")
    keys = ("requests", "failed", "hit_rate", "follow_up_hit_rate", "ttft_p90_ms",
            "imbalance_cv", "served_cv", "view_error", "idle_p10")  # fmt: skip
    print(f"{'':22s}" + "".join(f"{k:>19s}" for k in keys))
    for name, r in results.items():
        cells = []
        for k in keys:
            v = r[k]
            if v is None:
                cells.append("-")
                continue
            cell = f"{v:.3f}" if isinstance(v, float) else str(v)
            b = base[k] if base is not None else None
            if (base is not r and isinstance(v, float) and isinstance(b, float) and b
                    and k in ("hit_rate", "follow_up_hit_rate", "ttft_p90_ms")):  # fmt: skip
                cell += f" ({v / b:.2f}x)"
            cells.append(cell)
        mark = "  SATURATED" if r["idle_p10"] < 0.1 else ""
        if r.get("converged_s") is not None:
            mark += f"  (Redis back: all parts up after {r['converged_s']:.2f} s)"
        print(f"{name:22s}" + "".join(f"{c:>19s}" for c in cells) + mark)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateways", default="1,2,4")
    parser.add_argument("--workloads", default="shared-prefix,conversation")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of sending")
    parser.add_argument("--rate", type=float, default=24.0, help="shared-prefix req/s at 1x")
    parser.add_argument("--slowdown", type=float, default=4.0)
    parser.add_argument("--unshared", action="store_true", help="also without Redis")
    parser.add_argument("--sync-s", type=float, default=0.05, help="the gateways' state.sync_s")
    parser.add_argument(
        "--load-sync-s", type=float, default=0.01, help="the gateways' state.load_sync_s"
    )
    parser.add_argument(
        "--kill-redis", action="store_true",
        help="kill Redis a third into each shared run, start it again at two thirds",
    )  # fmt: skip
    parser.add_argument(
        "--kv-events", action="store_true",
        help="also with the sim workers publishing KV-cache events, every gateway subscribed",
    )  # fmt: skip
    parser.add_argument(
        "--num-gpu-blocks", type=int,
        help="each sim worker's KV cache in blocks of 16 tokens (default: its profile's,"
        " 26,875): a smaller one puts the caches under pressure",
    )  # fmt: skip
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()
    counts = [int(n) for n in args.gateways.split(",")]
    everything: dict[str, dict[str, dict[str, Any]]] = {}
    for workload in args.workloads.split(","):
        results: dict[str, dict[str, Any]] = {}
        for count in counts:
            name = f"{count} gateway{'s' if count > 1 else ''}"
            results[name] = run_one(workload, count, count > 1, args)
            if args.unshared and count > 1:
                results[name + " unshared"] = run_one(workload, count, False, args)
            if args.kv_events:
                results[name + " kv-events"] = run_one(workload, count, count > 1, args, True)
        show(workload, results)
        everything[workload] = results
    if args.out:
        Path(args.out).write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
