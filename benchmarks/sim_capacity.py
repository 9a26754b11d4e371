"""How much load one CPU core of sim workers carries, so live routing benchmarks stay below it.

    .venv/bin/python benchmarks/sim_capacity.py [--seconds 20] [--rates 20,40,80]

Starts one sim worker process (`--replicas 4` of h100-llama3-8b, a profile fast enough that the
engine is never the limit) pinned to core 0, and puts open-loop streaming load on it with
`fleetgate bench` from core 1, one bench per replica. For each offered rate it prints the
streamed tokens/s, the streams open at once, the worker process's CPU and the quotient:
streamed tokens/s per core.
The reference beside it is the engine's own pace: whether TPOT stayed at the profile's
(a worker that cannot keep up shows it as TPOT far above the engine's step time).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from harness import PY, cpu_seconds, drain, process, read_until


def _bench(url: str, rate: float, seconds: float, seed: int, out: str) -> list[str]:
    return ["taskset", "-c", "1", PY, "-m", "fleetgate", "bench", "--target", url,
            "--workload", "synthetic", "--input-len", "256", "--output-len", "256",
            "--rate", str(rate), "--duration", str(seconds), "--grace", "10",
            "--seed", str(seed), "--quiet", "--out", f"{out}/{seed}"]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rates", default="10,20,40", help="req/s per replica, comma-separated")
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args()
    worker_cmd = ["taskset", "-c", "0", PY, "-m", "fleetgate", "worker", "sim", "--port", "0",
                  "--model", "m", "--profile", "h100-llama3-8b",
                  "--replicas", str(args.replicas)]  # fmt: skip
    with process(worker_cmd) as worker:
        urls = [read_until(worker, r"on (http://\S+)").group(1) for _ in range(args.replicas)]
        drain(worker)
        print(f"{'req/s':>8}{'tok/s':>10}{'streams':>9}{'worker CPU':>12}{'tok/s/core':>12}"
              f"{'TPOT p50 ms':>13}")  # fmt: skip
        for rate in (float(r) for r in args.rates.split(",")):
            with tempfile.TemporaryDirectory() as out:
                cpu0, t0 = cpu_seconds(worker.pid), time.monotonic()
                benches = [
                    subprocess.Popen(
                        _bench(url, rate, args.seconds, i, out),
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    for i, url in enumerate(urls)
                ]
                for bench in benches:
                    bench.wait()
                cpu = (cpu_seconds(worker.pid) - cpu0) / (time.monotonic() - t0)
                summaries = [
                    json.loads((Path(out) / str(i) / "summary.json").read_text())["summary"]
                    for i in range(len(urls))
                ]
            tokens = sum(s["output_throughput"] for s in summaries)
            # Little's law: streams open at once = arrival rate x time each stays open.
            streams = sum(s["request_throughput"] * s["e2e_ms"]["mean"] / 1e3 for s in summaries)
            tpot = max(s["tpot_ms"]["p50"] for s in summaries if s["tpot_ms"])
            print(f"{rate * len(urls):8.0f}{tokens:10,.0f}{streams:9.0f}{cpu:12.0%}"
                  f"{tokens / cpu:12,.0f}{tpot:13.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
