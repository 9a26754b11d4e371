"""Routing policies side by side: the same workload, the same offered load, the same sim fleet.

    .venv/bin/python benchmarks/routing.py [--workloads shared-prefix,azure-conv,...]
        [--policies round_robin,least_requests,...] [--duration 60] [--slowdown 4]
        [--rates 26,28,30] [--weights 2.5,1] [--throttle 0=2@30]
    .venv/bin/python benchmarks/routing.py --sim [--replicas N | --gpus N] [--workloads ...]
        [--policies ...] [--duration 60] [--rates ...] [--out DIR]
    .venv/bin/python benchmarks/routing.py --report RESULTS_JSON... [--out DIR]

For each workload a fleet of sim workers starts afresh for every policy (so no policy inherits
another's warm caches), the gateway routes with that policy (or sglang-router does, when
`sglang-router` is on PATH: `cache_aware` and `power_of_two`), and `fleetgate bench` replays the
workload open-loop. One table per workload: throughput (req/s, output tok/s), TTFT p50/p90/p99,
E2E p99 (ms), goodput (requests meeting the SLO per second of sending: the same window for
every policy), the fleet's prefix-cache hit rate (from the engines' own counters), and two
spreads over backends, each beside round robin's in the same run (a ratio):
- utilization: the share of its compute a backend's engine spent on the tokens it was given,
  tokens computed per second (vLLM's prompt + generation - prefix-cache hit counters) over
  the saturated rate of its profile (1 / compute_per_token_s, slowed by --slowdown), as model
  FLOPs utilization is defined. An H100 doing 2.7x an A100's tokens is equally utilized;
- KV: the engine's time-averaged KV-cache use (equal only if every backend holds as many
  requests: with equal memory, a faster GPU that rightly takes more requests holds more).
Both over the second half of the sending window, sampled every 0.5 s (the first half fills
the fleet; after it, the drain measures how fast each engine empties, not how load was
shared); spread = (max - min) / mean over backends.

With several `--rates`, every policy runs at each, and a last table gives each policy's SLO
attainment by rate and the highest rate at which it still meets the SLO for 90% of requests
(DistServe's goodput), 95% and 99% (an SLO stated on p99 latencies), interpolated linearly
between the measured rates; then the same for a tight SLO (the first token within 1 s instead
of 2 s), from the same requests. `--report` runs nothing: it prints the same tables from saved
results.json files, merged by rate and policy, so one sweep can be made of several runs.

Fleetgate's policies run with its defaults: no weight typed, each backend's weight calibrated
from its engine's measured speed. `NAME/typed` runs NAME with the workload's typed weights
instead, static (the mixed fleet's H100s 2.5, A100s 1; `--weights` overrides them).
A policy named `NAME/pdN` disaggregates the same fleet: its first N workers prefill, the others
decode with the KV handed over (vLLM's kv_transfer_params protocol; the sim's decode engine
waits for the KV to cross a 200 Gb/s link), each side routed by NAME.

`--throttle N=F@S` makes worker N (in fleet order) F times slower S seconds into sending, as a
GPU that throttles under heat does (the sim's slowdown fault), for every policy alike: static
weights keep sending it its old share; calibrated ones follow its speed. S must fall in the
first half of the sending window, so the utilization figures see the throttled speed.

The machine has 2 cores: sim workers run `--slowdown` times slower than the GPU they model, so
a fleet of 8 streams within the CPU, and offered rates are scaled to match. Each run records the
machine's CPU idle; a run where it fell under 10% is marked SATURATED and its figures are not
comparable (the machine, not the fleet, was the bottleneck).

`--sim` runs the same comparison in the fleet simulator (routing_sim.py, docs/simulator.md) at
any fleet size: for each workload and policy, one region, one gateway routing by the policy,
`--replicas N` (or `--gpus N`) of the workload's engine profile at its modelled speed (no time
dilation, so no --slowdown), each offered the load a live replica is, for --duration of
simulated sending; then the same tables. The simulated engines' utilization and KV use are
not sampled (their spreads show "-"), nor is the machine's CPU. sglang-router, typed weights,
disaggregation, --throttle and the shared-prefix workload's shape run live only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import routing_sim
from harness import (
    PY,
    cpu_times,
    drain,
    free_port,
    gateway,
    get,
    metric,
    post,
    process,
    read_until,
    wait_http,
)

from fleetgate.bench.report import RECORDS_FILE, read_records
from fleetgate.bench.stats import Slo, summarize
from fleetgate.workers.sim.profiles import get_profile

MODEL = "sim-8b"
MIN_IDLE = 0.10  # below this share of CPU idle a run is saturated
COMPUTED = ("prompt_tokens", "generation_tokens")  # vLLM counters of tokens through the model
SLO_TTFT_S, SLO_TPOT_S = 2.0, 0.2  # goodput's bounds on time to first token and per token
# The same per-token bound with the first token due within 1 s, as interactive chat asks:
# attainment under it is reported beside the goodput SLO's, from the same requests.
SLO_TIGHT = Slo(ttft_ms=1000.0, itl_ms=SLO_TPOT_S * 1e3)
TTFT_EDGE_S = 2.5  # vLLM's TTFT histogram has no 2 s edge: the engine-side check uses the next


@dataclass(frozen=True)
class Workload:
    fleet: tuple[tuple[str, int], ...]  # (sim profile, replicas)
    bench: str  # `fleetgate bench` arguments
    weights: tuple[float, ...] = ()  # the typed weight of each fleet entry's backends; 1 if none


@dataclass(frozen=True)
class Throttle:
    worker: int  # index in fleet order
    factor: float  # its steps take this many times longer
    at_s: float  # seconds into sending

    @classmethod
    def parse(cls, text: str) -> Throttle:
        match = re.fullmatch(r"(\d+)=([\d.]+)@([\d.]+)", text)
        if match is None:
            raise argparse.ArgumentTypeError(f"--throttle takes N=FACTOR@SECONDS, not {text!r}")
        return cls(int(match[1]), float(match[2]), float(match[3]))


H100 = "h100-llama3-8b"
WORKLOADS = {
    # SGLang's generated shared prefix, scaled so that the groups' prompts do not all fit in
    # one engine's KV cache (128 x 4096 tokens > 430k) but do fit in the fleet's.
    "shared-prefix": Workload(
        ((H100, 8),),
        "--workload shared-prefix --groups 128 --prompts-per-group 64 --system-prompt-len 4096"
        " --question-len 128 --output-len 64 --rate 64",
    ),
    "mooncake-conv": Workload(((H100, 8),), "--workload mooncake-conv --rate 2"),
    "azure-conv": Workload(((H100, 8),), "--workload azure-conv --rate 45"),
    # An editor's completions (fleetgate/bench/config.py): ~2,000-token prompts, ~30-token
    # answers, in bursts of 8 on average over 1 s; 30 req/s is near the fleet's saturation.
    "code-completion": Workload(((H100, 8),), "--workload code-completion --rate 30"),
    # Static weights as an operator would type them from single-stream benchmarks: the H100's
    # ITL at concurrency 1 (4.6 ms) against the A100's (11.7 ms), for the `NAME/typed` runs;
    # the others type none and calibrate.
    "mixed-azure-conv": Workload(
        ((H100, 4), ("a100-llama3-8b", 4)), "--workload azure-conv --rate 34", weights=(2.5, 1.0)
    ),
}
POLICIES = (
    "round_robin", "weighted_round_robin/typed", "least_requests",
    "power_of_two", "least_loaded", "least_response_time", "prefix_cache", "balanced",
    "sglang:cache_aware", "sglang:power_of_two",
)  # fmt: skip


@dataclass
class Samples:
    """What the sampler saw during one run."""

    idle: list[float] = field(default_factory=list)  # CPU idle share per interval
    kv: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # (s, KV use)
    tokens: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # (s, computed)


@contextmanager
def _sims(fleet: Sequence[tuple[str, int]], slowdown: float) -> Iterator[list[str]]:
    urls: list[str] = []
    with ExitStack() as stack:
        for profile, replicas in fleet:
            proc = stack.enter_context(process(
                [PY, "-m", "fleetgate", "worker", "sim", "--port", "0", "--model", MODEL,
                 "--profile", profile, "--replicas", str(replicas), "--slowdown", str(slowdown)]
            ))  # fmt: skip
            for _ in range(replicas):
                urls.append(read_until(proc, r"on (http://127\.0\.0\.1:\d+)").group(1))
            drain(proc)
        for url in urls:
            wait_http(url + "/health")
        yield urls


@contextmanager
def _router(policy: str, urls: list[str], weights: list[float], workdir: Path) -> Iterator[str]:
    if policy.startswith("sglang:"):
        port = free_port()
        args = ["sglang-router", "launch", "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *urls, "--policy", policy.split(":", 1)[1],
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                "--health-check-interval-secs", "5"]  # fmt: skip
        with process(args) as proc:
            drain(proc)
            url = f"http://127.0.0.1:{port}"
            wait_http(url + "/v1/models", 90.0)
            yield url
        return
    config = workdir / f"{policy.replace('/', '-')}.yaml"
    # "NAME": the gateway's defaults, no weight typed (they calibrate themselves); "NAME/typed":
    # the workload's typed weights, static; "NAME/pdN": the first N workers prefill, the others
    # decode with the KV handed over (vLLM's disaggregation protocol).
    name, _, variant = policy.partition("/")
    typed = variant == "typed"
    backends = [
        {"url": u, "weight": w if typed else 1.0} for u, w in zip(urls, weights, strict=True)
    ]
    pool: dict[str, Any] = {"model": MODEL, "policy": name, "backends": backends,
                            "weights": {"calibrate": not typed}}  # fmt: skip
    if variant.startswith("pd"):
        prefill = int(variant[2:])
        pool["prefill"] = {"backends": backends[:prefill], "policy": name}
        pool["backends"] = backends[prefill:]
    # /admin/backends tells the weights routing ended with (calibrated ones included).
    config.write_text(json.dumps({"pools": [pool], "seed": 1, "server": {"admin": True}}))
    with gateway(config) as (url, _):
        yield url


def _sample(urls: list[str], stop: threading.Event, samples: Samples) -> None:
    start = time.monotonic()
    idle0, total0 = cpu_times()
    while not stop.wait(0.5):
        idle1, total1 = cpu_times()
        if total1 > total0:
            samples.idle.append((idle1 - idle0) / (total1 - total0))
        idle0, total0 = idle1, total1
        for url in urls:
            try:
                text = get(url + "/metrics", 2.0)
            except OSError:
                continue
            at = time.monotonic() - start
            samples.kv.setdefault(url, []).append((at, metric(text, "vllm:kv_cache_usage_perc")))
            computed = sum(metric(text, f"vllm:{n}_total") for n in COMPUTED) - metric(
                text, "vllm:prefix_cache_hits_total"
            )
            samples.tokens.setdefault(url, []).append((at, computed))


def _cache_counters(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in urls:
        text = get(url + "/metrics")
        hits += metric(text, "vllm:prefix_cache_hits_total")
        queries += metric(text, "vllm:prefix_cache_queries_total")
    return hits, queries


def _over(text: str, name: str, bound_s: float) -> float:
    """The share of a histogram's observations above `bound_s` (which must be a bucket edge)."""
    count = metric(text, name + "_count")
    return 1.0 - metric(text, name + "_bucket", le=f"{bound_s}") / count if count else 0.0


def _engine_figures(
    urls: list[str],
) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """Per backend, from its own metrics: the shares of its finished requests over the SLO's
    TTFT (at TTFT_EDGE_S) and TPOT bounds (where the SLO misses happen), and the seconds its
    sim engine ran behind the modelled GPU (Python could not keep up)."""
    misses: dict[str, tuple[float, float]] = {}
    lost: dict[str, float] = {}
    for url in urls:
        text = get(url + "/metrics")
        misses[url] = (
            _over(text, "vllm:time_to_first_token_seconds", TTFT_EDGE_S),
            _over(text, "vllm:time_per_output_token_seconds", SLO_TPOT_S),
        )
        lost[url] = metric(text, "fleetgate_sim_lost_seconds_total")
    return misses, lost


def _with_rate(bench: str, rate: float | None) -> str:
    """The workload's load-generator arguments, at `rate` req/s when one is given."""
    return bench if rate is None else re.sub(r"--rate \S+", f"--rate {rate:g}", bench)


def _kv_use(samples: Samples, start: float, end: float) -> dict[str, float]:
    """Per backend, its mean KV-cache use over the samples taken in [start, end] s."""
    means: dict[str, float] = {}
    for url, series in samples.kv.items():
        window = [kv for t, kv in series if start <= t <= end]
        if window:
            means[url] = sum(window) / len(window)
    return means


def _compute_use(
    samples: Samples, start: float, end: float, seconds_per_token: dict[str, float]
) -> dict[str, float]:
    """Per backend, tokens computed per second in [start, end] s times its seconds a token
    at saturation (slowdown included): the share of its compute in use."""
    shares: dict[str, float] = {}
    for url, series in samples.tokens.items():
        window = [(t, n) for t, n in series if start <= t <= end]
        if len(window) >= 2 and window[-1][0] > window[0][0]:
            rate = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])
            shares[url] = rate * seconds_per_token[url]
    return shares


def _spread(values: dict[str, float]) -> float:
    mean = sum(values.values()) / len(values) if values else 0.0
    return (max(values.values()) - min(values.values())) / mean if mean else 0.0


def run_one(
    workload: Workload, policy: str, args: argparse.Namespace, rate: float | None, workdir: Path
) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / policy.replace(":", "-").replace("/", "-")
    weights = args.weights or workload.weights or (1.0,) * len(workload.fleet)
    typed = [w for (_, replicas), w in zip(workload.fleet, weights, strict=True)
             for _ in range(replicas)]  # fmt: skip
    cost = [get_profile(profile).compute_per_token_s * args.slowdown
            for profile, replicas in workload.fleet for _ in range(replicas)]  # fmt: skip
    with (
        _sims(workload.fleet, args.slowdown) as urls,
        _router(policy, urls, typed, workdir) as url,
    ):
        samples, stop = Samples(), threading.Event()
        sampler = threading.Thread(target=_sample, args=(urls, stop, samples), daemon=True)
        sampler.start()
        throttle = _throttle(urls, args.throttle, args.slowdown)
        bench = [PY, "-m", "fleetgate", "bench", "--target", url, "--model", MODEL,
                 "--duration", str(args.duration), "--grace", str(args.grace), "--seed", "0",
                 "--quiet", "--out", str(out), "--save-requests",
                 *_with_rate(workload.bench, rate).split(),
                 "--slo-ttft-ms", f"{SLO_TTFT_S * 1e3:g}",
                 "--slo-itl-ms", f"{SLO_TPOT_S * 1e3:g}"]  # fmt: skip
        subprocess.run(bench, check=False, stdout=subprocess.DEVNULL)  # failures are in the summary
        stop.set()
        sampler.join()
        if throttle is not None:
            throttle.cancel()
        hits, queries = _cache_counters(urls)
        misses, lost = _engine_figures(urls)
        final_weights = {} if policy.startswith("sglang:") else _weights(url)
    summary = json.loads((out / "summary.json").read_text())["summary"]
    window = (args.duration / 2, args.duration)
    kv_use = _kv_use(samples, *window)
    per_token = dict(zip(urls, cost, strict=True))
    if args.throttle is not None:
        per_token[urls[args.throttle.worker]] *= args.throttle.factor
    utilization = _compute_use(samples, *window, per_token)
    idle = sorted(samples.idle)
    good = (summary["slo_attainment"] or 0.0) * summary["requests"]
    records = read_records(out / RECORDS_FILE)
    tight = summarize(records, args.duration, SLO_TIGHT).slo_attainment or 0.0
    return {
        "summary": summary,
        "goodput": good / args.duration,
        "slo_attainment_tight": tight,
        "hit_rate": hits / queries if queries else 0.0,
        "spread": _spread(utilization),
        "utilization": utilization,
        "kv_spread": _spread(kv_use),
        "kv_use": kv_use,
        "engine_slo_misses": misses,
        "weights": final_weights,
        "sim_lost_s": lost,
        "idle_p10": idle[len(idle) // 10] if idle else 1.0,
        "throttle": None
        if args.throttle is None
        else vars(args.throttle) | {"url": urls[args.throttle.worker]},
    }


def run_sim(
    workload: Workload, policy: str, args: argparse.Namespace, rate: float | None, workdir: Path
) -> dict[str, Any]:
    """`run_one` in the fleet simulator (routing_sim.py): `args.replicas` or `args.gpus` of the
    workload's profile, each offered a live replica's load."""
    scenario = routing_sim.scenario(
        fleet=workload.fleet, bench=_with_rate(workload.bench, rate), model=MODEL,
        policy=policy, replicas=_sim_replicas(workload, args), duration_s=args.duration,
        slo=Slo(SLO_TTFT_S * 1e3, SLO_TPOT_S * 1e3),
    )  # fmt: skip
    result = routing_sim.run(scenario, SLO_TIGHT, workdir / policy)
    count = result["summary"]["requests"]
    print(f"  {count:,} requests simulated in {result['wall_s']:.1f} s of wall time", flush=True)
    return result


def _sim_replicas(workload: Workload, args: argparse.Namespace) -> int:
    """The simulated fleet's size: --replicas, else --gpus in replicas, else the live one's."""
    return routing_sim.replicas_for(workload.fleet, replicas=args.replicas, gpus=args.gpus)


def _title(name: str, workload: Workload, args: argparse.Namespace, rate: float | None) -> str:
    """A table's title and its key in results.json: the workload, a simulation's fleet, and
    the rate when --rates gave one (after "@", which `report` reads)."""
    if args.sim:
        name = f"{name} sim {_sim_replicas(workload, args)} x {workload.fleet[0][0]}"
    return name if rate is None else f"{name}@{rate:g}"


def _throttle(
    urls: list[str], throttle: Throttle | None, slowdown: float
) -> threading.Timer | None:
    """Arm the throttle: at its time, its worker's steps take `factor` times longer."""
    if throttle is None:
        return None
    body = json.dumps({"slowdown": slowdown * throttle.factor}).encode()
    url = urls[throttle.worker] + "/admin/faults"
    timer = threading.Timer(throttle.at_s, post, args=(url, body))
    timer.daemon = True
    timer.start()
    return timer


def _weights(gateway_url: str) -> dict[str, float]:
    """Each backend's effective weight in the gateway as the run ends."""
    listing = json.loads(get(gateway_url + "/admin/backends", 2.0))
    return {b["url"]: b["weight"] for b in listing}


def _values(r: dict[str, Any]) -> list[float]:
    s = r["summary"]
    nan = float("nan")  # no request completed: no latency to show
    ttft, e2e = s["ttft_ms"] or {}, s["e2e_ms"] or {}
    # A simulation does not sample its engines' utilization and KV use: None, shown as "-".
    spreads = [nan if r[k] is None else r[k] * 100 for k in ("spread", "kv_spread")]
    return [
        s["request_throughput"], s["output_throughput"], ttft.get("p50", nan),
        ttft.get("p90", nan), ttft.get("p99", nan), e2e.get("p99", nan), r["goodput"],
        r["hit_rate"] * 100, *spreads,
    ]  # fmt: skip


def _row(name: str, r: dict[str, Any], base: dict[str, Any] | None) -> list[str]:
    refs = _values(base) if base is not None else None
    cells = [name]
    for i, value in enumerate(_values(r)):
        if value != value:  # NaN: nothing to show
            cells.append("-")
            continue
        ref = refs[i] if refs else 0.0
        ratio = f" ({value / ref:.2f}x)" if ref and ref == ref else ""
        cells.append(f"{value:.1f}{ratio}")
    # A simulation has no CPU idle: virtual time waits for the machine.
    saturated = " SATURATED" if r.get("idle_p10", 1.0) < MIN_IDLE else ""
    cells.append(f"{r['summary']['failed']}{saturated}")
    return cells


HEADER = ["policy", "req/s", "out tok/s", "TTFT p50", "TTFT p90", "TTFT p99", "E2E p99",
          "goodput", "cache hit %", "util spread %", "KV spread %", "failed"]  # fmt: skip


def print_table(title: str, results: dict[str, dict[str, Any]]) -> None:
    base = results.get("round_robin")
    rows = [HEADER] + [_row(name, r, base) for name, r in results.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    print(f"\n== {title} (ratios to round_robin in the same run) ==")
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        print("  ".join(cells))


ATTAINMENT_GOALS = (0.90, 0.95, 0.99)  # DistServe's goodput at 90%; p95- and p99-bound SLOs


def sustained(points: list[tuple[float, float]], goal: float) -> str:
    """The highest offered rate whose SLO attainment is at least `goal`, interpolated linearly
    between the measured (rate, attainment) points around the first one below it."""
    if points[0][1] < goal:
        return f"<{points[0][0]:g}"
    for (r0, a0), (r1, a1) in pairwise(points):
        if a1 < goal:
            return f"{r0 + (r1 - r0) * (a0 - goal) / (a0 - a1):.1f}"
    return f">={points[-1][0]:g}"


def print_sweep(
    title: str, sweep: dict[float, dict[str, dict[str, Any]]], policies: list[str]
) -> None:
    """SLO attainment per policy and rate, and the highest rate each policy sustains: under the
    goodput SLO, then under the tight one. A rate some policy did not run at shows "-" for it
    (sweeps merged from several runs)."""
    slos: dict[str, Callable[[dict[str, Any]], float]] = {
        f"TTFT {SLO_TTFT_S:g} s, TPOT {SLO_TPOT_S * 1e3:g} ms": lambda r: (
            r["summary"]["slo_attainment"] or 0.0
        ),
        f"TTFT {SLO_TIGHT.ttft_ms or 0:g} ms, TPOT {SLO_TIGHT.itl_ms or 0:g} ms": lambda r: r[
            "slo_attainment_tight"
        ],
    }
    rates = sorted(sweep)
    goals = [f"rate at {g:.0%}" for g in ATTAINMENT_GOALS]
    for slo, attainment in slos.items():
        rows = [["policy", *[f"@{r:g}" for r in rates], *goals]]
        for policy in policies:
            points = [(r, attainment(sweep[r][policy])) for r in rates if policy in sweep[r]]
            ran = dict(points)
            rows.append([policy, *[f"{ran[r]:.3f}" if r in ran else "-" for r in rates],
                         *[sustained(points, g) for g in ATTAINMENT_GOALS]])  # fmt: skip
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        print(f"\n== {title}: SLO attainment by offered req/s ({slo}) ==")
        for row in rows:
            cells = [row[0].ljust(widths[0])]
            cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
            print("  ".join(cells))


def report(paths: list[str], out: str) -> int:
    """Print the tables of saved results.json files, merged by workload@rate and policy (a
    later file's entry replaces an earlier one's), and write the merged file to `out`. Runs
    made with different --throttle settings are refused: they do not compare."""
    merged: dict[str, dict[str, dict[str, Any]]] = {}
    for path in paths:
        for title, results in json.loads(Path(path).read_text()).items():
            entries = merged.setdefault(title, {})
            if len({_setting(r) for r in (*entries.values(), *results.values())}) > 1:
                print(f"{title} in {path}: ran with another --throttle; not merging them")
                return 2
            entries.update(results)
    sweeps: dict[str, dict[float, dict[str, dict[str, Any]]]] = {}
    for title, results in merged.items():
        name, _, at = title.partition("@")
        if at:
            sweeps.setdefault(name, {})[float(at)] = results
        else:
            print_table(title, results)
    for name, sweep in sweeps.items():
        for rate in sorted(sweep):
            print_table(f"{name}@{rate:g}", sweep[rate])
        policies = list(dict.fromkeys(p for ran in sweep.values() for p in ran))
        if len(sweep) > 1:
            print_sweep(name, sweep, policies)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "results.json").write_text(json.dumps(merged, indent=1))
    return 0


def _setting(result: dict[str, Any]) -> str:
    """A run's --throttle, less the throttled worker's URL (a port of that run's own fleet)."""
    throttle = result.get("throttle") or {}
    return json.dumps({k: v for k, v in throttle.items() if k != "url"}, sort_keys=True)


def _live_only(policy: str) -> bool:
    """sglang-router's policies, typed weights (NAME/typed) and disaggregation (NAME/pdN)."""
    return policy.startswith("sglang:") or "/" in policy


def _sim_refusal(name: str) -> str | None:
    """Why the simulator cannot run workload `name` as it runs live, or None."""
    return routing_sim.refusal(WORKLOADS[name].fleet, WORKLOADS[name].bench)


def _check_sim(
    parser: argparse.ArgumentParser, args: argparse.Namespace, workloads: list[str],
    policies: list[str],
) -> None:  # fmt: skip
    """Refuse what a simulation cannot run (parser.error: exits), naming it."""
    if args.slowdown is not None:
        parser.error("--sim needs no --slowdown: the simulator keeps virtual time")
    if args.throttle is not None:
        parser.error("--throttle runs live only")
    live_only = [p for p in policies if _live_only(p)]
    if live_only:
        parser.error(f"{', '.join(live_only)}: live only (sglang-router, typed weights and "
                     "disaggregation are not in the simulator's gateway config); --sim runs "
                     "the gateway's own policies")  # fmt: skip
    for name in workloads:
        if name not in WORKLOADS:
            parser.error(f"unknown workload {name!r}; one of {', '.join(WORKLOADS)}")
        why = _sim_refusal(name)
        if why is not None:
            parser.error(f"{name} runs live only: {why}")
        try:
            size = _sim_replicas(WORKLOADS[name], args)
        except ValueError as exc:
            parser.error(str(exc))
        if size < 1:
            parser.error(f"a simulated fleet needs at least 1 replica, not {size}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workloads", default=None,
        help=f"default: {','.join(WORKLOADS)} (--sim: those it runs)",
    )  # fmt: skip
    parser.add_argument(
        "--policies", default=None,
        help=f"default: {','.join(POLICIES)} (--sim: the gateway's own)",
    )  # fmt: skip
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument(
        "--grace", type=float, default=60.0,
        help="live: seconds the load generator waits for answers after sending (a simulation"
        " runs until every answer)",
    )  # fmt: skip
    parser.add_argument(
        "--slowdown", type=float, default=None,
        help=f"live sim workers' time dilation (default {routing_sim.LIVE_SLOWDOWN:g}); not with"
        " --sim: the simulator keeps virtual time and needs none",
    )  # fmt: skip
    parser.add_argument(
        "--sim", action="store_true",
        help="run each policy in the fleet simulator instead of live sim workers and a gateway,"
        " at any fleet size (--replicas, --gpus), each replica offered a live replica's load",
    )  # fmt: skip
    fleet = parser.add_mutually_exclusive_group()
    fleet.add_argument(
        "--replicas", type=int, default=None,
        help="--sim: replicas in the fleet (default: the live fleet's)",
    )  # fmt: skip
    fleet.add_argument(
        "--gpus", type=int, default=None,
        help="--sim: GPUs in the fleet, in replicas of the workload's profile",
    )  # fmt: skip
    parser.add_argument("--out", default="", help="write results.json here")
    parser.add_argument(
        "--rates", type=lambda v: [float(r) for r in v.split(",")], default=[None],
        help="offered req/s, for every workload (default: each workload's own; --sim scales it"
        " to its fleet as it does those); several, e.g. 26,28,30, run each policy at each and"
        " print the highest rate each sustains",
    )  # fmt: skip
    parser.add_argument(
        "--weights", type=lambda v: tuple(float(w) for w in v.split(",")), default=None,
        help="typed weights, one per hardware group of the fleet (e.g. 3,1), for NAME/typed runs",
    )  # fmt: skip
    parser.add_argument(
        "--throttle", type=Throttle.parse, default=None,
        help="N=FACTOR@SECONDS: worker N (fleet order) becomes FACTOR times slower that many"
        " seconds into sending (thermal throttling), e.g. 0=2@30",
    )  # fmt: skip
    parser.add_argument(
        "--report", nargs="+", default=None, metavar="RESULTS_JSON",
        help="run nothing: print the tables of saved results.json files, merged by rate and"
        " policy (and write the merged file to --out, if given)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.report:
        return report(args.report, args.out)
    if args.throttle is not None and args.throttle.at_s > args.duration / 2:
        parser.error("--throttle must start in the first half of --duration")
    policies = [p for p in args.policies.split(",") if p] if args.policies else list(POLICIES)
    workloads = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    if args.sim:
        if args.policies is None:
            policies = [p for p in policies if not _live_only(p)]
        if args.workloads is None:
            workloads = [w for w in workloads if _sim_refusal(w) is None]
        _check_sim(parser, args, workloads, policies)
    elif args.replicas is not None or args.gpus is not None:
        parser.error("--replicas and --gpus size a simulated fleet: give --sim")
    if args.slowdown is None:
        args.slowdown = routing_sim.LIVE_SLOWDOWN
    run = run_sim if args.sim else run_one
    if not args.sim and shutil.which("sglang-router") is None:
        dropped = [p for p in policies if p.startswith("sglang:")]
        policies = [p for p in policies if not p.startswith("sglang:")]
        if dropped:
            print("sglang-router is not on PATH: skipping", ", ".join(dropped))
    workdir = Path(args.out or tempfile.mkdtemp(prefix="routing-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    everything: dict[str, dict[str, Any]] = {}
    for name in workloads:
        workload = WORKLOADS[name]
        sweep: dict[float, dict[str, dict[str, Any]]] = {}
        for rate in args.rates:
            title = _title(name, workload, args, rate)
            results: dict[str, dict[str, Any]] = {}
            for policy in policies:
                print(f"{title}: {policy} ...", flush=True)
                results[policy] = run(workload, policy, args, rate, workdir / title)
                everything[title] = results
                (workdir / "results.json").write_text(json.dumps(everything, indent=1))
            print_table(title, results)
            if rate is not None:
                sweep[rate] = results
        if len(sweep) > 1:
            print_sweep(_title(name, workload, args, None), sweep, policies)
    print(f"\nresults: {workdir / 'results.json'}  (cpus: {os.cpu_count()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
