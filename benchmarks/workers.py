"""`fleetgate serve --workers N`: how the gateway's requests per second grow with its processes,
each count measured in the same run and printed as a ratio to one worker.

    .venv/bin/python benchmarks/workers.py [--workers 1,2,4,8] [--seconds 6] [--state]

For each N: `fleetgate serve --workers N` in front of a pool of 8 backends that answer a small
chat completion at once (nginx's `return` when nginx is on PATH: its workers are faster than
any gateway process; else one fast_upstream.py process per backend), driven by wrk (JSON POST,
64 connections per worker). Where the machine has the cores, the gateway's workers get N cores
of their own and the upstream and wrk the rest, split evenly; on a machine with fewer cores
everything shares them, and the report says so, since the cores and not the gateway are then
the limit. Printed per N: req/s, its ratio to one worker's, the gateway's CPU (its workers'
together, in cores) and CPU per request. `--state` starts a throwaway Redis and gives the
workers `state.url`, as a deployment of several workers would run (the load board, the
decisions and the rest shared through it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from harness import PY, Redis, cpu_seconds, drain, free_port, process, read_until, wait_http
from overhead import CHAT, _rps

HERE = Path(__file__).resolve().parent
BACKENDS = 8
ANSWER = (
    '{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"fast","choices":[{'
    '"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    '"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}'
)
NGINX = """
daemon off; worker_processes {workers}; pid {tmp}/nginx.pid; error_log {tmp}/error.log;
events {{ worker_connections 8192; }}
http {{
  access_log off; client_body_temp_path {tmp}; keepalive_requests 1000000;
{servers}
}}
"""
SERVER = """  server {{
    listen 127.0.0.1:{port};
    location / {{ default_type application/json; return 200 '{answer}'; }}
  }}
"""


@dataclass(frozen=True)
class Cores:
    """Which cores each part runs on (empty: not pinned)."""

    gateway: str
    upstream: str
    wrk: str
    upstream_count: int
    wrk_threads: int

    @staticmethod
    def plan(workers: int, total: int) -> Cores:
        if shutil.which("taskset") is None or total < workers + 2:
            return Cores("", "", "", max(1, total // 2), max(1, total // 2))
        rest = total - workers
        upstream = max(1, rest // 2)
        wrk_first = workers + upstream
        return Cores(
            f"0-{workers - 1}", f"{workers}-{wrk_first - 1}", f"{wrk_first}-{total - 1}",
            upstream, total - wrk_first,
        )  # fmt: skip

    def pin(self, cores: str) -> list[str]:
        return ["taskset", "-c", cores] if cores else []


@contextmanager
def upstream(cores: Cores, tmp: str) -> Iterator[list[str]]:
    """The pool's 8 backends, answering at once; their URLs."""
    ports = [free_port() for _ in range(BACKENDS)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    nginx = shutil.which("nginx") or shutil.which("/usr/sbin/nginx")
    pin = cores.pin(cores.upstream)
    with ExitStack() as stack:
        if nginx:
            servers = "".join(SERVER.format(port=port, answer=ANSWER) for port in ports)
            conf = Path(tmp) / "nginx.conf"
            conf.write_text(NGINX.format(workers=cores.upstream_count, tmp=tmp, servers=servers))
            cmd = [*pin, nginx, "-c", str(conf), "-e", f"{tmp}/error.log"]
            drain(stack.enter_context(process(cmd)))
        else:
            for port in ports:
                cmd = [*pin, PY, str(HERE / "fast_upstream.py"), "--port", str(port)]
                drain(stack.enter_context(process(cmd)))
        for url in urls:
            wait_http(url + "/v1/models", 20.0)
        yield urls


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (the supervisor's workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def gateway_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with suppress(OSError):  # a worker gone meanwhile
            total += cpu_seconds(pid)
    return total


def measure(workers: int, seconds: float, state: str | None, tmp: str) -> dict[str, float]:
    cores = Cores.plan(workers, os.cpu_count() or 1)
    with upstream(cores, tmp) as urls:
        config = Path(tmp) / f"gateway-{workers}.yaml"
        backends = "".join(f"      - url: {url}\n" for url in urls)
        config.write_text(
            f"pools:\n  - model: fast\n    backends:\n{backends}"
            + (f"state:\n  url: {state}\n" if state else "")
        )
        cmd = [*cores.pin(cores.gateway), PY, "-m", "fleetgate", "serve", "--config", str(config),
               "--port", "0", "--workers", str(workers)]  # fmt: skip
        with process(cmd) as proc:
            url = read_until(proc, r"listening on (http://\S+)").group(1)
            drain(proc)
            wait_http(url + "/readyz")
            time.sleep(1.0)  # every worker up (the supervisor says "listening" at the first)
            pids = children(proc.pid) or [proc.pid]  # one worker: serve runs it itself
            with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
                script.write(
                    f"wrk.method = 'POST'\nwrk.body = '{CHAT}'\n"
                    "wrk.headers['Content-Type'] = 'application/json'\n"
                )
            wrk = [*cores.pin(cores.wrk), "wrk", f"-t{cores.wrk_threads}", f"-c{64 * workers}",
                   "-d1s", "-s", script.name, url + "/v1/chat/completions"]  # fmt: skip
            subprocess.run(wrk, capture_output=True, check=True)  # warm every worker's pool
            wrk[wrk.index("-d1s")] = f"-d{max(1, round(seconds))}s"
            cpu0, t0 = gateway_cpu(pids), time.monotonic()
            out = subprocess.run(wrk, capture_output=True, text=True, check=True).stdout
            cpu = (gateway_cpu(pids) - cpu0) / (time.monotonic() - t0)
            os.unlink(script.name)
            if "Non-2xx" in out or "Socket errors" in out:
                print(f"  warning: wrk saw errors:\n{out}", file=sys.stderr)
    rps = _rps(out)
    return {"rps": rps, "cores": cpu, "cpu_us": cpu / rps * 1e6 if rps else 0.0,
            "pinned": float(bool(cores.gateway))}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each wrk run")
    parser.add_argument("--state", action="store_true", help="the workers share state in Redis")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("needs wrk (apt-get install -y wrk)")
    counts = [int(n) for n in args.workers.split(",")]
    total = os.cpu_count() or 1
    print(f"{total} cores; {'with' if args.state else 'without'} state.url", flush=True)
    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        state = None
        if args.state:
            redis = Redis(tmp)
            redis.start()
            stack.callback(redis.kill)
            state = redis.url
        for n in counts:
            print(f"--workers {n} ...", flush=True)
            results[n] = measure(n, args.seconds, state, tmp)
    first = results[counts[0]]
    print(f"\n| workers | req/s | x {counts[0]} | gateway CPU (cores) | CPU per request |")
    print("|---|---|---|---|---|")
    for n, r in results.items():
        shared = "" if r["pinned"] else " (cores shared)"
        ratio = r["rps"] / first["rps"]
        print(f"| {n}{shared} | {r['rps']:,.0f} | {ratio:.2f}x | {r['cores']:.2f} | "
              f"{r['cpu_us']:.1f} us |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
