"""Overload: the built-in fleet offered ten times what it serves, by tenants of every class,
and an interactive tenant beside a batch tenant. Every figure is printed beside its reference
from the same run.

    .venv/bin/python benchmarks/overload.py [--seconds 60] [--out FILE]

The fleet: the built-in 8B pool (one h100-llama3-8b and one a100-llama3-8b sim worker) behind
a gateway process, prompts of 1,024 tokens and answers of 128, streamed, every client giving
up after 30 s (the batch tenant's after 120 s, its queue deadline being 60 s). As in the
built-in fleet, the sims schedule by priority and each request carries its class
(`pools[].engine_priority`); `--no-engine-priority` measures engines that queue first come
first served.

  0. capacity: the gateway with admission off and `--concurrency` clients in a closed loop
     (each sends its next request when its last one ends, none gives up): what the fleet
     completes per second after the first third of the window is its capacity.
  1. overload, admission on, ten times capacity in all for `--seconds`: `critical` 0.5x,
     `standard` 2x, `sheddable` 4x, and two standard tenants of equal weight, `even-a` 2.5x
     and `even-b` 1x (fair queuing gives them the same goodput; first come first served would
     give even-a 2.5 times even-b's).
  2. an interactive tenant alone at half of capacity, then the same beside a batch tenant
     (the batch lane) offering three times capacity: its TTFT p99 against its own alone.

Per tenant: offered, admitted (any answer but a refusal), succeeded, shed (by status),
timed out (the answer began but did not end in 30 s), hung (no answer at all in 30 s: must be
0), TTFT p50/p99 of its successes, goodput (successes that ended within the phase, per second,
after its first tenth); and whether every refusal had a Retry-After.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import gateway, metric

from fleetgate.bench.generated import LengthDist, synthetic
from fleetgate.bench.runner import LoadGenerator, LoadSettings
from fleetgate.bench.stats import RequestRecord, percentile
from fleetgate.bench.workloads import PoissonArrivals, bounded, schedule
from fleetgate.http.client import HttpClient, Origin
from fleetgate.http.errors import UpstreamError

MODEL = "llama-3.1-8b-instruct"
PROMPT, OUTPUT = 1024, 128
CLIENT_TIMEOUT_S = 30.0
BATCH_TIMEOUT_S = 120.0  # a batch client waits longer; its queue deadline is 60 s
# The capacity phase's clients. On the 2-core VM (2026-11-25) the fleet completed 28.8, 37.9,
# 39.1 and 33.5 req/s with 64, 128, 256 and 512 clients: 256 is where it peaks (more fill the
# KV caches and the engines preempt).
CONCURRENCY = 256
WARMUP = 0.1  # of each phase, before goodput is counted: the queues fill


@dataclass(frozen=True)
class Tenant:
    name: str
    priority: str
    share: float  # of capacity, offered
    batch: bool = False


OVERLOAD = (
    Tenant("critical", "critical", 0.5),
    Tenant("standard", "standard", 2.0),
    Tenant("sheddable", "sheddable", 4.0),
    Tenant("even-a", "standard", 2.5),
    Tenant("even-b", "standard", 1.0),
)
INTERACTIVE = Tenant("interactive", "standard", 0.5)
BATCH = Tenant("batch", "sheddable", 3.0, batch=True)


def key(tenant: str) -> str:
    return f"sk-overload-{tenant}"


def config(
    admission: bool, engine_priority: bool = False, request_log: Path | None = None
) -> dict[str, Any]:
    tenants = [*OVERLOAD, INTERACTIVE, BATCH]
    log = {"path": str(request_log), "max_lines_per_s": 100_000} if request_log else {}
    return {
        "request_log": log,
        "pools": [{
            "model": MODEL,
            "backends": [{"sim": "h100-llama3-8b"}, {"sim": "a100-llama3-8b"}],
            "admission": {"enabled": admission},
            "engine_priority": engine_priority,
        }],
        "tenants": [
            {"name": t.name, "keys": [key(t.name)], "priority": t.priority, "batch": t.batch,
             "queue_timeout_s": 60.0 if t.batch else 10.0}
            for t in tenants
        ],
    }  # fmt: skip


@contextmanager
def fleet(
    admission: bool, engine_priority: bool = False, request_log: Path | None = None
) -> Iterator[Origin]:
    """A gateway over the built-in 8B pool, with the tenants above."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "overload.json"
        path.write_text(json.dumps(config(admission, engine_priority, request_log)))
        with gateway(path) as (url, _):
            yield Origin.parse(url)


async def watch(origin: Origin, samples: list[tuple[float, float]]) -> None:
    """The pool's concurrency limit and queue, from the gateway's metrics, once a second (on
    a client of its own: not queued behind the load's connections)."""
    client = HttpClient()
    try:
        while True:
            await asyncio.sleep(1.0)
            try:
                samples.append(await _sample(client, origin))
            except UpstreamError as exc:  # a missed sample, not the end of sampling
                print(f"   (metrics sample failed: {exc})", file=sys.stderr)
    finally:
        await client.close()


async def _sample(client: HttpClient, origin: Origin) -> tuple[float, float]:
    answer = await client.request(origin, b"GET", b"/metrics", [], timeout_s=2.0)
    answer.expire_in(2.0, "metrics sample too slow")
    text = (await answer.read()).decode()
    limit = metric(text, "fleetgate_admission_limit_requests", model=MODEL)
    return limit, metric(text, "fleetgate_admission_waiting_requests", model=MODEL)


async def rejections(origin: Origin) -> dict[str, dict[str, float]]:
    """The gateway's own count of refusals, by tenant and reason."""
    client = HttpClient()
    try:
        answer = await client.request(origin, b"GET", b"/metrics", [])
        text = (await answer.read()).decode()
    finally:
        await client.close()
    found: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if line.startswith("fleetgate_rejected_total{"):
            labels = dict(
                part.split("=", 1)
                for part in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            tenant, reason = labels["tenant"].strip('"'), labels["reason"].strip('"')
            found.setdefault(tenant, {})[reason] = float(line.rsplit(" ", 1)[1])
    return found


async def offer(
    origin: Origin,
    tenants: list[tuple[Tenant, float]],
    seconds: float,
    seed: int,
    samples: list[tuple[float, float]] | None = None,
) -> dict[str, list[RequestRecord]]:
    """Each tenant's open-loop Poisson load at its rate (req/s), all at once (and the
    admission's limit and queue sampled into `samples`)."""
    client = HttpClient(connect_timeout_s=5.0)
    watcher = None
    if samples is not None:
        watcher = asyncio.get_running_loop().create_task(watch(origin, samples))
    try:
        runs = []
        for i, (tenant, rate) in enumerate(tenants):
            rng = random.Random(seed * 100 + i)
            prompts = synthetic(rng, input_len=LengthDist(PROMPT), output_len=LengthDist(OUTPUT))
            specs = bounded(schedule(prompts, PoissonArrivals(rate), rng), seconds)
            timeout_s = BATCH_TIMEOUT_S if tenant.batch else CLIENT_TIMEOUT_S
            settings = LoadSettings(
                MODEL, seconds, grace_s=timeout_s + 5, api_key=key(tenant.name),
                request_timeout_s=timeout_s,
            )  # fmt: skip
            runs.append(LoadGenerator(client, origin, settings, clock=time.monotonic).run(specs))
        results = await asyncio.gather(*runs)
        return {t.name: r.records for (t, _), r in zip(tenants, results, strict=True)}
    finally:
        if watcher is not None:
            watcher.cancel()
        await client.close()


async def capacity(origin: Origin, clients: int, seconds: float) -> float:
    """Completions per second of `clients` closed-loop clients, after the first third."""
    client = HttpClient(connect_timeout_s=5.0)
    rng = random.Random(0)
    prompts = synthetic(rng, input_len=LengthDist(PROMPT), output_len=LengthDist(OUTPUT))
    settings = LoadSettings(MODEL, seconds * 2, grace_s=600.0, api_key=key("standard"))
    generator = LoadGenerator(client, origin, settings, clock=time.monotonic)
    started = time.monotonic()
    ends: list[float] = []

    async def loop() -> None:
        while time.monotonic() - started < seconds:
            spec = next(prompts)
            result = await generator.run([spec])
            if result.records and result.records[0].ok:
                ends.append(time.monotonic() - started)

    try:
        await asyncio.gather(*(loop() for _ in range(clients)))
    finally:
        await client.close()
    counted = [t for t in ends if seconds / 3 <= t <= seconds]
    return len(counted) / (seconds * 2 / 3)


def machine_busy() -> tuple[float, float]:
    """The machine's busy and total CPU time so far, in clock ticks (all cores)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def timeline(runs: dict[str, list[RequestRecord]], seconds: float, step: float) -> list[float]:
    """Successes completed per second in each `step` of the phase, all tenants together."""
    counts = [0] * int(seconds // step)
    for records in runs.values():
        for r in records:
            end = r.sent_s + (r.e2e_s or 0.0)
            if r.ok and 0 <= end < len(counts) * step:
                counts[int(end // step)] += 1
    return [c / step for c in counts]


def goodput(records: list[RequestRecord], seconds: float, warmup: float = WARMUP) -> float:
    """Successes completed per second within the phase, after its warm-up (not the ones
    that ended after it: a queue left at the end would count at no cost)."""
    start = seconds * warmup
    ends = (r.sent_s + (r.e2e_s or 0.0) for r in records if r.ok)
    return sum(1 for end in ends if start <= end <= seconds) / (seconds - start)


def row(name: str, records: list[RequestRecord], seconds: float) -> dict[str, Any]:
    kinds = Counter(r.error or "ok" for r in records)
    shed = {k: v for k, v in kinds.items() if k.startswith(("http_4", "http_5"))}
    refusals = [r for r in records if r.error in ("http_429", "http_503")]
    ttfts = sorted(r.ttft_s for r in records if r.ok and r.ttft_s is not None)
    return {
        "tenant": name,
        "offered": len(records),
        "admitted": len(records) - sum(shed.values()) - kinds["no_answer"],
        "succeeded": kinds["ok"],
        "shed": shed,
        "timed_out": kinds["timeout"],
        "hung": kinds["no_answer"],
        "other_errors": {k: v for k, v in kinds.items()
                         if k not in ("ok", "timeout", "no_answer") and k not in shed},
        "refusals_without_retry_after": sum(1 for r in refusals if r.retry_after_s is None),
        "ttft_p50_ms": percentile(ttfts, 50) * 1000 if ttfts else None,
        "ttft_p99_ms": percentile(ttfts, 99) * 1000 if ttfts else None,
        "goodput": goodput(records, seconds),
    }  # fmt: skip


def show(rows: list[dict[str, Any]]) -> None:
    head = (f"{'tenant':12}{'offered':>8}{'admitted':>9}{'ok':>7}{'shed':>16}{'timed out':>10}"
            f"{'hung':>6}{'TTFT p50':>10}{'p99 ms':>9}{'goodput/s':>10}")  # fmt: skip
    print(head)
    for r in rows:
        shed = ",".join(f"{k[5:]}:{v}" for k, v in sorted(r["shed"].items())) or "-"
        p50 = f"{r['ttft_p50_ms']:.0f}" if r["ttft_p50_ms"] is not None else "-"
        p99 = f"{r['ttft_p99_ms']:.0f}" if r["ttft_p99_ms"] is not None else "-"
        print(f"{r['tenant']:12}{r['offered']:>8}{r['admitted']:>9}{r['succeeded']:>7}"
              f"{shed:>16}{r['timed_out']:>10}{r['hung']:>6}{p50:>10}{p99:>9}"
              f"{r['goodput']:>10.1f}")  # fmt: skip
        if r["other_errors"]:
            print(f"{'':12}other errors: {r['other_errors']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each phase")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument(
        "--capacity", type=float, help="skip phase 0 and take this as the fleet's capacity (req/s)"
    )
    parser.add_argument("--no-engine-priority", action="store_true",
                        help="the sims queue first come first served and requests carry no "
                        "priority (the built-in fleet has pools[].engine_priority on)")  # fmt: skip
    parser.add_argument("--request-log", type=Path, metavar="FILE",
                        help="the gateway's request log, every line, to this file")  # fmt: skip
    parser.add_argument("--batch-only", action="store_true",
                        help="skip the overload (phase 1): the batch lane only")  # fmt: skip
    parser.add_argument("--no-batch", action="store_true",
                        help="stop after the overload (skip the batch-lane phase)")  # fmt: skip
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY,
                        help="closed-loop clients measuring capacity")  # fmt: skip
    args = parser.parse_args()
    seconds = args.seconds
    report: dict[str, Any] = {"seconds": seconds, "prompt": PROMPT, "output": OUTPUT}

    if args.capacity is not None:
        cap = args.capacity
        print(f"0. capacity: {cap} req/s, as given (--capacity)")
    else:
        print(f"0. capacity: admission off, {args.concurrency} clients in a closed loop for "
              f"{seconds:.0f} s ...", flush=True)  # fmt: skip
        with fleet(admission=False) as origin:
            cap = asyncio.run(capacity(origin, args.concurrency, seconds))
    report["capacity"] = cap
    print(f"   capacity: {cap:.1f} req/s completed\n")

    engine_priority = not args.no_engine_priority
    report["engine_priority"] = engine_priority
    with fleet(True, engine_priority, args.request_log) as origin:
        if not args.batch_only:
            offered = sum(t.share for t in OVERLOAD)
            print(f"1. overload: {offered:g}x capacity ({offered * cap:.0f} req/s) ...",
                  flush=True)  # fmt: skip
            load = [(t, t.share * cap) for t in OVERLOAD]
            samples: list[tuple[float, float]] = []
            busy0 = machine_busy()
            by_tenant = asyncio.run(offer(origin, load, seconds, 1, samples))
            busy1 = machine_busy()
            cpu = (busy1[0] - busy0[0]) / max(1.0, busy1[1] - busy0[1])
            reasons = asyncio.run(rejections(origin))
            rows = [row(t.name, by_tenant[t.name], seconds) for t in OVERLOAD]
            show(rows)
            total = sum(r["goodput"] for r in rows)
            a, b = (
                next(r["goodput"] for r in rows if r["tenant"] == n) for n in ("even-a", "even-b")
            )
            missing = sum(r["refusals_without_retry_after"] for r in rows)
            first_shed = {r["tenant"]: sum(r["shed"].values()) / max(1, r["offered"]) for r in rows}
            print(f"\n   goodput {total:.1f} req/s = {total / cap:.2f}x capacity (target >= 0.95)")
            # The same successes counted as the capacity's are (after the first third): the
            # steady state, without the overload's cold start.
            steady = sum(goodput(by_tenant[t.name], seconds, 1 / 3) for t in OVERLOAD)
            print(f"   after the first third, as capacity is counted: {steady:.1f} req/s = "
                  f"{steady / cap:.2f}x capacity")  # fmt: skip
            # The pool's first burst goes first come first served (nothing waits yet), and its
            # answers end inside the window above: the queue's own fairness, after them.
            sa, sb = (goodput(by_tenant[n], seconds, 1 / 3) for n in ("even-a", "even-b"))
            print(f"   even-a / even-b after the first third: {sa:.1f} / {sb:.1f}: "
                  f"{abs(sa - sb) / max(sa, sb, 1e-9):.0%} apart")  # fmt: skip
            gap = abs(a - b) / max(a, b, 1e-9)
            print(f"   even-a / even-b goodput: {a:.1f} / {b:.1f}: {gap:.0%} apart (target <= 10%)")
            print(
                f"   shed share: sheddable {first_shed['sheddable']:.0%}, standard "
                f"{first_shed['standard']:.0%}, critical {first_shed['critical']:.0%}"
            )
            print(
                f"   refusals without Retry-After: {missing}; hung: {sum(r['hung'] for r in rows)}"
            )
            steps = timeline(by_tenant, seconds, 5.0)
            print("   completed per second, by 5 s: " + " ".join(f"{x:.0f}" for x in steps))
            print(
                f"   the machine's CPU busy: {cpu:.0%} of its cores (load generator, gateway and "
                "sim workers together)"
            )
            for tenant, why in sorted(reasons.items()):
                print(
                    f"   {tenant} refused for: " + ", ".join(f"{r} {n:.0f}" for r, n in why.items())
                )
            print("   concurrency limit, each second: " + " ".join(f"{s[0]:.0f}" for s in samples))
            print("   waiting, each second: " + " ".join(f"{s[1]:.0f}" for s in samples))
            limits = sorted(s[0] for s in samples)
            queued = sorted(s[1] for s in samples)
            if limits:
                print(f"   concurrency limit min / median / max: {limits[0]:.0f} / "
                      f"{percentile(limits, 50):.0f} / {limits[-1]:.0f}; waiting median "
                      f"{percentile(queued, 50):.0f}, max {queued[-1]:.0f}\n")  # fmt: skip
            report["overload"] = {"rows": rows, "goodput": total, "goodput_ratio": total / cap,
                                  "steady_goodput": steady,
                                  "steady_fairness": sa / sb if sb else None,
                                  "fairness": a / b if b else None, "timeline_5s": steps,
                                  "cpu_busy": cpu}  # fmt: skip

        if args.no_batch:
            if args.out:
                args.out.write_text(json.dumps(report, indent=1))
            return 0
        print(f"2. interactive at {INTERACTIVE.share}x capacity alone, then beside a batch "
              f"tenant at {BATCH.share}x ...", flush=True)  # fmt: skip
        alone = asyncio.run(offer(origin, [(INTERACTIVE, INTERACTIVE.share * cap)], seconds, 2))
        mixed = asyncio.run(offer(origin, [(INTERACTIVE, INTERACTIVE.share * cap),
                                           (BATCH, BATCH.share * cap)], seconds, 3))  # fmt: skip
        rows2 = [row("alone", alone["interactive"], seconds),
                 row("with batch", mixed["interactive"], seconds),
                 row("batch", mixed["batch"], seconds)]  # fmt: skip
        show(rows2)
        p_alone, p_mixed = rows2[0]["ttft_p99_ms"], rows2[1]["ttft_p99_ms"]
        if p_alone and p_mixed:
            print(f"\n   interactive TTFT p99 beside batch / alone: {p_mixed:.0f} / {p_alone:.0f} "
                  f"ms = {p_mixed / p_alone:.2f}x (target <= 1.5x)")  # fmt: skip
        report["batch_lane"] = {"rows": rows2}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
