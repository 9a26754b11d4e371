"""Autoscaling under a 5x ramp, live: does the autoscaled pool meet its SLO as a fleet sized
for the peak does, on fewer GPU-seconds, without killing a request when it scales down?

    .venv/bin/python benchmarks/autoscale.py [--base-rate 3] [--phase-s 30] [--out DIR]

One workload, replayed twice from the same trace (`fleetgate bench --trace`, Poisson arrivals
whose rate ramps from `--base-rate` to 5x and back: base, ramp up, peak, ramp down, base, each
`--phase-s` long; 512 prompt and 128 answer tokens, streamed):

1. autoscaled: a gateway whose pool starts empty, `pools[].autoscale` with the local actuator
   (sim worker processes the gateway starts and drains before it stops them);
2. fixed: the same gateway over as many sim workers as the autoscaled run held at the peak,
   running the whole time (a fleet sized for the peak).

Each sim worker's KV cache is cut to `--kv-blocks` blocks (a replica holds a handful of
requests at once, so load per replica shows in latency as it does on a GPU). Printed: a
timeline (requests sent per second, replicas), then per run: requests, failed, broken
streams, SLO attainment (answered whole with TTFT <= --slo-ttft-ms), GPU-seconds (replicas,
draining ones included, integrated over the run); then each goal beside its figure:
attainment >= 99% of the fixed fleet's, GPU-seconds <= 0.7x its, 0 requests killed. The exit
status is 1 when a goal is not met. With --out, timeline.png (replicas against demand) and
results.json.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from harness import PY, drain, gateway, get, process, read_until

MODEL = "sim-8b"
PROMPT, ANSWER = 512, 128
PEAK = 5.0  # the peak's rate over the base's


def rate_at(t: float, base: float, phase: float) -> float:
    """The arrival rate at `t`: base, ramp up, peak, ramp down, base (each `phase` long)."""
    step, into = divmod(t, phase)
    low, high = base, base * PEAK
    return {
        0: low, 1: low + (high - low) * into / phase, 2: high,
        3: high - (high - low) * into / phase,
    }.get(int(step), low)  # fmt: skip


def write_trace(path: Path, base: float, phase: float, seed: int) -> float:
    """Poisson arrivals of the ramping rate (thinning), as a Mooncake JSONL; its length (s)."""
    rng = random.Random(seed)
    seconds, t, rows = 5 * phase, 0.0, []
    top = base * PEAK
    while True:
        t += rng.expovariate(top)
        if t >= seconds:
            break
        if rng.random() < rate_at(t, base, phase) / top:
            rows.append({"timestamp": round(t * 1000), "input_length": PROMPT,
                         "output_length": ANSWER})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return seconds


def pool_config(backends: list[str], autoscale: dict[str, Any] | None) -> dict[str, Any]:
    pool: dict[str, Any] = {
        "model": MODEL, "policy": "least_loaded", "slow_start_s": 2.0,
        "backends": [{"url": u} for u in backends],
        "health_check": {"interval_s": 0.5}, "engine_metrics": {"interval_s": 0.5},
    }  # fmt: skip
    if autoscale is not None:
        pool["autoscale"] = autoscale
    return {"server": {"admin": True}, "request_log": {"enabled": False}, "pools": [pool]}


def sample_replicas(url: str, stop: threading.Event, into: list[tuple[float, int]]) -> None:
    """Every second: the pool's replicas holding GPUs (serving, draining, starting)."""
    start = time.monotonic()
    while not stop.wait(1.0):
        try:
            pools = json.loads(get(url + "/admin/autoscale"))["pools"]
        except OSError:
            continue
        if pools:
            p = pools[0]
            into.append(
                (time.monotonic() - start, p["replicas"] + len(p["draining"]) + p["starting"])
            )


def run_load(url: str, trace: Path, seconds: float, out: Path) -> list[dict[str, Any]]:
    subprocess.run(
        [PY, "-m", "fleetgate", "bench", "--target", url, "--trace", str(trace),
         "--duration", str(seconds), "--grace", "60", "--quiet", "--out", str(out),
         "--save-requests"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    lines = (out / "requests.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def figures(records: list[dict[str, Any]], slo_ttft_s: float) -> dict[str, float]:
    failed = [r for r in records if r["error"]]
    broken = [r for r in records if not r["error"] and r["output_tokens"] < ANSWER]
    good = [
        r for r in records
        if not r["error"] and r["output_tokens"] >= ANSWER and r["ttft_s"] is not None
        and r["ttft_s"] <= slo_ttft_s
    ]  # fmt: skip
    ttfts = sorted(r["ttft_s"] * 1e3 for r in records if r["ttft_s"] is not None)
    return {
        "requests": len(records), "failed": len(failed), "broken": len(broken),
        "attainment": len(good) / len(records) if records else 0.0,
        "ttft_p50_ms": ttfts[len(ttfts) // 2] if ttfts else 0.0,
        "ttft_p99_ms": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else 0.0,
    }  # fmt: skip


def start_worker(stack: ExitStack, kv_blocks: int) -> str:
    proc = stack.enter_context(process([
        PY, "-m", "fleetgate", "worker", "sim", "--port", "0", "--model", MODEL,
        "--num-gpu-blocks-override", str(kv_blocks),
    ]))  # fmt: skip
    port = int(read_until(proc, r"on http://127\.0\.0\.1:(\d+)").group(1))
    drain(proc)
    return f"http://127.0.0.1:{port}"


def autoscaled_run(args: argparse.Namespace, trace: Path, seconds: float, out: Path
                   ) -> tuple[dict[str, float], list[tuple[float, int]]]:  # fmt: skip
    autoscale = {
        "enabled": True, "min_replicas": 1, "max_replicas": args.max_replicas,
        "interval_s": 1.0, "target_in_flight": args.target_in_flight,
        "scale_down_window_s": args.down_window_s, "max_step_down": 1,
        "smoothing_s": args.smoothing_s,
        "local": {"args": ["--num-gpu-blocks-override", str(args.kv_blocks)]},
    }  # fmt: skip
    config = out / "autoscaled.json"
    config.write_text(json.dumps(pool_config([], autoscale)))
    samples: list[tuple[float, int]] = []
    with gateway(config) as (url, _):
        stop = threading.Event()
        sampler = threading.Thread(target=sample_replicas, args=(url, stop, samples))
        sampler.start()
        try:
            records = run_load(url, trace, seconds, out / "autoscaled")
        finally:
            stop.set()
            sampler.join()
    return figures(records, args.slo_ttft_ms / 1e3), samples


def fixed_run(args: argparse.Namespace, trace: Path, seconds: float, out: Path, size: int
              ) -> dict[str, float]:  # fmt: skip
    with ExitStack() as stack:
        workers = [start_worker(stack, args.kv_blocks) for _ in range(size)]
        config = out / "fixed.json"
        config.write_text(json.dumps(pool_config(workers, None)))
        with gateway(config) as (url, _):
            records = run_load(url, trace, seconds, out / "fixed")
    return figures(records, args.slo_ttft_ms / 1e3)


def gpu_seconds(samples: list[tuple[float, int]]) -> float:
    """Replicas integrated over the samples (one a second)."""
    total, last = 0.0, 0.0
    for t, replicas in samples:
        total += replicas * (t - last)
        last = t
    return total


def plot(path: Path, samples: list[tuple[float, int]], args: argparse.Namespace, size: int) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    times = [t for t, _ in samples]
    axes.step(times, [r for _, r in samples], where="post", label="replicas (autoscaled)")
    axes.axhline(size, linestyle="--", color="gray", label=f"fixed fleet ({size})")
    demand = axes.twinx()
    grid = [i * 0.5 for i in range(int(5 * args.phase_s * 2))]
    demand.plot(grid, [rate_at(t, args.base_rate, args.phase_s) for t in grid], color="tab:red",
                label="demand (req/s)")  # fmt: skip
    axes.set_xlabel("seconds")
    axes.set_ylabel("replicas")
    demand.set_ylabel("requests per second")
    axes.legend(loc="upper left")
    demand.legend(loc="upper right")
    figure.savefig(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-rate", type=float, default=3.0)
    parser.add_argument("--phase-s", type=float, default=30.0)
    parser.add_argument("--kv-blocks", type=int, default=240)
    parser.add_argument("--target-in-flight", type=float, default=4.0)
    parser.add_argument("--max-replicas", type=int, default=6)
    parser.add_argument("--down-window-s", type=float, default=10.0)
    parser.add_argument("--smoothing-s", type=float, default=5.0)
    parser.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        trace = out / "ramp.jsonl"
        seconds = write_trace(trace, args.base_rate, args.phase_s, args.seed)
        auto, samples = autoscaled_run(args, trace, seconds, out)
        # Sized for the peak: the most replicas the autoscaled run held while at it.
        peak = [r for t, r in samples if 2 * args.phase_s <= t < 3 * args.phase_s]
        size = max(peak, default=args.max_replicas)
        fixed = fixed_run(args, trace, seconds, out, size)
        used = gpu_seconds(samples)
        fixed_used = size * (samples[-1][0] if samples else seconds)
        print(
            f"5x ramp: {args.base_rate:g} -> {args.base_rate * PEAK:g} req/s and back, "
            f"{seconds:.0f} s; fixed fleet: {size} replicas (the autoscaled run's at the peak)"
        )
        print("\n   t (s)  demand (req/s)  replicas")
        for t, replicas in samples[:: max(1, len(samples) // 30)]:
            print(f"  {t:6.0f}  {rate_at(t, args.base_rate, args.phase_s):14.1f}  {replicas:8d}")
        for name, f in (("autoscaled", auto), ("fixed", fixed)):
            print(
                f"\n{name}: {f['requests']:.0f} requests, {f['failed']:.0f} failed, "
                f"{f['broken']:.0f} broken streams, SLO attainment {f['attainment']:.2%}, "
                f"TTFT p50 {f['ttft_p50_ms']:.0f} ms, p99 {f['ttft_p99_ms']:.0f} ms"
            )
        ratio = used / fixed_used if fixed_used else float("inf")
        relative = auto["attainment"] / fixed["attainment"] if fixed["attainment"] else 0.0
        killed = auto["failed"] + auto["broken"]
        goals = (
            ("SLO attainment vs the fixed fleet's", f"{relative:.3f}x", ">= 0.99x",
             relative >= 0.99),
            ("GPU-seconds vs the fixed fleet's", f"{used:.0f} / {fixed_used:.0f} = {ratio:.2f}x",
             "<= 0.70x", ratio <= 0.7),
            ("requests killed (failed or broken)", f"{killed:.0f}", "0", killed == 0),
        )  # fmt: skip
        print()
        for what, figure, goal, met in goals:
            print(f"  {what:38s} {figure:>22s}   goal {goal:9s} {'met' if met else 'NOT MET'}")
        if args.out is not None:
            plot(out / "timeline.png", samples, args, size)
            results = {"autoscaled": auto, "fixed": fixed, "size": size, "gpu_seconds": used,
                       "fixed_gpu_seconds": fixed_used, "samples": samples}  # fmt: skip
            (out / "results.json").write_text(json.dumps(results, indent=1))
        return 0 if all(met for *_, met in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
