"""The config reloaded 20 times under steady streaming load: does any request fail, and what
does it cost the tail?

    .venv/bin/python benchmarks/reload.py [--seconds 60] [--rate 12] [--changes 20]

Four sim workers (each its own process) and a gateway started from a config file that it
watches (`server.watch_config_s`). `fleetgate bench` sends open-loop streaming requests for the
whole run, twice: first with no change (the reference, measured in the same run), then while
the config changes `--changes` times, spread evenly: each change picks another two or three of
the workers (backends added and removed) and another routing policy, and is applied in turn by
the file changing, by SIGHUP, and by POST /admin/config. Halfway, a broken file is written and
signalled: it must be refused with the running config kept. Printed for both runs: requests
sent, failed, broken streams, TTFT and end-to-end p99, and the ratio of the changing run's p99
to the reference's; then the reloads the gateway counted, by trigger and result.
"""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from harness import PY, drain, get, metric, post, process, read_until, streaming_load, wait_http

MODEL = "sim-8b"
POLICIES = ("round_robin", "least_requests", "balanced", "power_of_two", "prefix_cache")
TRIGGERS = ("file", "signal", "admin")
RELOADS = "fleetgate_config_reloads_total"
SUBSETS = ((0, 1), (1, 2, 3), (2, 3), (0, 2, 3), (0, 1, 3), (1, 2))  # of the four workers


def config(ports: list[int], subset: tuple[int, ...], policy: str) -> dict[str, Any]:
    backends = [{"url": f"http://127.0.0.1:{ports[i]}"} for i in subset]
    return {
        "server": {"admin": True, "watch_config_s": 0.5},
        "request_log": {"enabled": False},
        "pools": [{"model": MODEL, "policy": policy, "backends": backends}],
    }


def start_worker(stack: ExitStack) -> int:
    proc = stack.enter_context(
        process([PY, "-m", "fleetgate", "worker", "sim", "--port", "0", "--model", MODEL])
    )
    port = int(read_until(proc, r"on http://127\.0\.0\.1:(\d+)").group(1))
    drain(proc)
    return port


def reloads(url: str, via: str, result: str) -> float:
    return metric(get(url + "/metrics"), RELOADS, via=via, result=result)


def wait_for(url: str, via: str, result: str, before: float, seconds: float = 10.0) -> None:
    """Until the gateway has counted one more reload of `via` with `result`."""
    deadline = time.monotonic() + seconds
    while reloads(url, via, result) <= before:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway counted no {via} {result} in time")
        time.sleep(0.02)


def ready(url: str) -> bool:
    return get(url + "/readyz").startswith('{"status":"ready"')


def run(
    ports: list[int], out: Path, args: argparse.Namespace, changes: int
) -> tuple[list[dict[str, Any]], dict[str, float], bool]:
    """One run of `args.seconds` under load, changing the config `changes` times: the
    requests' records, the reloads counted, and whether the broken file was refused."""
    path = out / "gw.yaml"
    path.write_text(json.dumps(config(ports, SUBSETS[0], POLICIES[0])))
    args_ = [PY, "-m", "fleetgate", "serve", "--config", str(path), "--port", "0"]
    refused_broken = changes == 0
    with process(args_) as gw:
        url = read_until(gw, r"listening on (http://\S+)").group(1)
        drain(gw)
        wait_http(url + "/readyz")
        bench = streaming_load(url, out, args.seconds, args.rate, args.output_len)
        start, gap = time.monotonic(), args.seconds / (changes + 1)
        for i in range(changes):
            time.sleep(max(0.0, (i + 1) * gap - (time.monotonic() - start)))
            if i == changes // 2:  # broken: refused, the running config kept
                refusals = reloads(url, "signal", "failure")
                path.write_text("pools: [")
                gw.send_signal(signal.SIGHUP)
                wait_for(url, "signal", "failure", refusals)
                refused_broken = ready(url)
            new = config(ports, SUBSETS[(i + 1) % len(SUBSETS)], POLICIES[(i + 1) % len(POLICIES)])
            trigger = TRIGGERS[i % len(TRIGGERS)]
            counted_before = reloads(url, trigger, "success")
            if trigger == "admin":
                post(url + "/admin/config", json.dumps(new).encode())
            else:
                path.write_text(json.dumps(new))
                if trigger == "signal":
                    gw.send_signal(signal.SIGHUP)
            wait_for(url, trigger, "success", counted_before)
        bench.wait(timeout=args.seconds + 120)
        text = get(url + "/metrics")
        counted = {
            f"{via} {result}": metric(text, RELOADS, via=via, result=result)
            for via in TRIGGERS
            for result in ("success", "failure")
        }
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return records, counted, refused_broken


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=12.0, help="requests per second")
    parser.add_argument("--output-len", type=int, default=120)
    parser.add_argument("--changes", type=int, default=20)
    args = parser.parse_args()
    with ExitStack() as stack:
        ports = [start_worker(stack) for _ in range(4)]
        results = {}
        for name, changes in (("no change", 0), (f"{args.changes} reloads", args.changes)):
            out = Path(tempfile.mkdtemp(prefix="reload-"))
            results[name] = run(ports, out, args, changes)
    print(f"reload run: {args.seconds:.0f} s at {args.rate:g} req/s each, 4 sim workers, "
          f"streams of {args.output_len} tokens")  # fmt: skip
    reference: tuple[float, float] | None = None
    for name, (records, counted, refused_broken) in results.items():
        failed = [r for r in records if r["error"]]
        broken = [r for r in records if r["error"] or r["output_tokens"] < args.output_len]
        ttft = p99([r["ttft_s"] * 1e3 for r in records if r["ttft_s"] is not None])
        e2e = p99([r["e2e_s"] * 1e3 for r in records if not r["error"]])
        reference = reference or (ttft, e2e)
        print(f"\n{name}:")
        print(f"  requests sent        {len(records)}")
        print(f"  failed               {len(failed)}   target 0")
        print(f"  broken streams       {len(broken)}   target 0")
        print(f"  TTFT p99             {ttft:8.1f} ms  ({ttft / reference[0]:.2f}x no change)")
        print(f"  end-to-end p99       {e2e:8.1f} ms  ({e2e / reference[1]:.2f}x no change)")
        if any(counted.values()):
            listed = ", ".join(f"{k}: {v:.0f}" for k, v in counted.items())
            print(f"  reloads counted      {listed}")
            print(f"  broken file refused, old config kept: {'yes' if refused_broken else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
