"""A worker dies under steady streaming load and comes back: does any client notice?

    .venv/bin/python benchmarks/chaos.py [--seconds 60] [--rate 12] [--output-len 120]

Four sim workers (each its own process) behind the gateway; `fleetgate bench` sends open-loop
streaming requests for the whole run. At 1/3 of the run one worker is killed with SIGKILL, at
2/3 it is restarted on the same port. Printed: requests sent, succeeded, failed, broken
streams (an error, or fewer tokens than asked), stream continuations and retries (from the
gateway's metrics), how long the killed worker stayed in rotation, and TTFT p99 before, during
and after the outage (the "before" figure is the reference measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from harness import PY, drain, gateway, get, metric, process, read_until, streaming_load

MODEL = "sim-8b"


def _start_worker(stack: ExitStack, port: int) -> tuple[subprocess.Popen[str], int]:
    proc = stack.enter_context(
        process([PY, "-m", "fleetgate", "worker", "sim", "--port", str(port), "--model", MODEL])
    )
    found = int(read_until(proc, r"on http://127\.0\.0\.1:(\d+)").group(1))
    drain(proc)
    return proc, found


def _metric(url: str, name: str, **labels: str) -> float:
    return metric(get(url + "/metrics"), name, **labels)


def _p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=12.0, help="requests per second")
    parser.add_argument("--output-len", type=int, default=120)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="chaos-"))
    events: dict[str, float] = {}
    with ExitStack() as stack:
        workers = [_start_worker(stack, 0) for _ in range(4)]
        config = out / "gw.yaml"
        backends = [{"url": f"http://127.0.0.1:{port}"} for _, port in workers]
        config.write_text(json.dumps({"pools": [{"model": MODEL, "backends": backends}]}))
        url, _ = stack.enter_context(gateway(config))
        victim_port = workers[1][1]
        victim_id = f"127.0.0.1:{victim_port}"
        bench = streaming_load(url, out, args.seconds, args.rate, args.output_len)
        start = time.monotonic()
        time.sleep(args.seconds / 3)
        workers[1][0].send_signal(signal.SIGKILL)
        events["kill"] = time.monotonic() - start
        while _metric(url, "fleetgate_backend_healthy", backend=victim_id) != 0:
            time.sleep(0.02)
        events["out"] = time.monotonic() - start
        time.sleep(max(0.0, 2 * args.seconds / 3 - (time.monotonic() - start)))
        workers[1] = _start_worker(stack, victim_port)
        events["restart"] = time.monotonic() - start
        bench.wait(timeout=args.seconds + 120)
        continuations = _metric(url, "fleetgate_stream_continuations_total")
        retries = _metric(url, "fleetgate_retries_total")
        back = _metric(url, "fleetgate_backend_healthy", backend=victim_id)
        served_after = _metric(f"http://127.0.0.1:{victim_port}", "vllm:request_success_total")
    report(out, events, args, continuations, retries, back, served_after)
    return 0


def report(
    out: Path, events: dict[str, float], args: argparse.Namespace, continuations: float,
    retries: float, back: float, served_after: float,
) -> None:  # fmt: skip
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    failed = [r for r in records if r["error"]]
    broken = [r for r in records if r["error"] or r["output_tokens"] < args.output_len]
    phases: dict[str, list[float]] = {"before": [], "during": [], "after": []}
    for r in records:
        if r["ttft_s"] is None:
            continue
        phase = "before" if r["sent_s"] < events["kill"] else (
            "during" if r["sent_s"] < events["restart"] else "after")  # fmt: skip
        phases[phase].append(r["ttft_s"] * 1e3)
    print(f"chaos run: {args.seconds:.0f} s at {args.rate:g} req/s, 4 workers, "
          f"SIGKILL at {events['kill']:.1f} s, restart at {events['restart']:.1f} s")  # fmt: skip
    print(f"requests sent          {len(records)}")
    print(f"succeeded              {len(records) - len(failed)}")
    print(f"failed                 {len(failed)}   target 0")
    print(f"broken streams         {len(broken)}   target 0")
    print(f"stream continuations   {continuations:.0f}")
    print(f"retries                {retries:.0f}")
    print(f"time to eject          {events['out'] - events['kill']:.3f} s   target < 1 s")
    print(f"back in rotation       {'yes' if back == 1 else 'no'} "
          f"(served {served_after:.0f} requests after its restart)")  # fmt: skip
    before = _p99(phases["before"])
    for phase, values in phases.items():
        print(f"TTFT p99 {phase:7}       {_p99(values):8.1f} ms  ({len(values)} requests, "
              f"{_p99(values) / before:.2f}x before)")  # fmt: skip
    print(f"records: {out}")


if __name__ == "__main__":
    raise SystemExit(main())
