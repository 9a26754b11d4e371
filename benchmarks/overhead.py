"""How much the gateway costs: the same load straight to a fast upstream and through fleetgate,
measured in one run, printed side by side with their ratio.

    make bench-overhead            # or: .venv/bin/python benchmarks/overhead.py [--seconds 10]

Layout (2 cores): the gateway alone on core 0; the upstream and wrk share core 1. Measured:
  1. non-streaming req/s at concurrency 64 (wrk, small JSON POST);
  2. added p50 latency at concurrency 1 (wrk --latency). For this one the upstream moves to
     core 0 beside the gateway, so that the direct path and the proxied path cross between
     cores the same number of times: on a VM a cross-core wake-up costs ~50 us, which would
     otherwise be charged to the gateway though any proxy pays it;
  3. 256 concurrent SSE streams of 21 chunks paced over 200 ms: completed streams/s against
     the offered 1,280/s, and the gateway's CPU (from /proc) while relaying them; the median
     of three runs.
nginx (reverse proxy, keep-alive upstream, buffering off, one worker) and `sglang-router`, when
on PATH, are measured in the gateway's place too, as references from the same machine and run.
The gateway runs with its defaults: least_requests routing and metrics on. With `--auth`, a
second gateway runs with API keys and a tenant's rate limits on (in-process store, limits set
high enough never to refuse) and is printed beside it, as the ratio to the gateway without:
both run at once and are measured window by window in turn (three rounds, medians), since on
a shared VM the machine's speed drifts between runs by more than the difference measured.
The pair's req/s ratio is then also taken with both loaded at once (c64 each), sharing core
0, five windows, medians: the drift then slows both alike, and the CPU each spends per
request (from /proc) is printed beside it; taken in turn, the ratio moves by +-0.1 here.
With `--pair observability`, the same pairing compares the gateway as it runs by default
(metrics, the request log and the dashboard's live view on) with one whose are all off;
`--pair request-log`, with one whose request log alone is off; `--pair tracing`, with one that
also traces at 10% sampling, exporting to a local OTLP receiver (otlp_sink.py) that drops it.

With `--baseline REF`, the gateway of this tree is measured beside the gateway of commit REF
(made once into a cache of its own: baseline.py), both with their defaults, window by window
in turn (`--rounds`, three by default) and then loaded at once; the ratios this tree / REF are
printed with the targets of docs/benchmarks.md. Every change to the request path is measured
this way against the reference commit named there, not only against its parent.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from baseline import fleetgate_command
from harness import PY, cpu_seconds, drain, free_port, get, process, wait_http

HERE = Path(__file__).resolve().parent
CHAT = '{"model":"fast","messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
STREAM = '{"model":"fast","messages":[{"role":"user","content":"hi"}],"stream":true}'
OFFERED_STREAMS = 256 / 0.2  # 256 streams, each lasting 200 ms
# The streams are measured this many times and the median kept: on a shared VM one window's
# CPU figure moves by several points from one run to the next.
STREAM_WINDOWS = 3


def _pin(core: int) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
        return ["taskset", "-c", str(core)]
    return []


@contextmanager
def _serving(cmd: list[str], health: str) -> Iterator[subprocess.Popen[str]]:
    with process(cmd) as proc:
        drain(proc)
        wait_http(health, 20.0)
        yield proc


AUTH_KEY = "sk-overhead-benchmark"
AUTH_CONFIG = f"""
tenants:
  - name: bench
    keys: [{AUTH_KEY}]
    limits: {{requests_per_minute: 1.0e+12, tokens_per_minute: 1.0e+15}}
"""


@dataclass(frozen=True)
class Pair:
    """Two gateways compared window by window: `base` and `other` (config appended to the
    pool's), `key` the API key the other needs."""

    base_name: str
    base: str
    other_name: str
    other: str
    key: str | None
    line: str  # what the ratio is called in the report
    base_command: tuple[str, ...] = (PY, "-m", "fleetgate")  # what runs the base gateway
    rounds: int = 3  # windows taken in turn per figure, alternating


PAIRS = {
    "auth": Pair("fleetgate", "", "fleetgate+auth", AUTH_CONFIG, AUTH_KEY,
                 "keys and rate limits on / off"),
    "observability": Pair("fleetgate-obs-off",
                          "server: {metrics: false, dashboard: false}\n"
                          "request_log: {enabled: false}\n",
                          "fleetgate", "", None,
                          "metrics, request log and dashboard on / all off"),
    # The figure: metrics and the request log on (tracing and the dashboard off).
    "metrics-log": Pair("fleetgate-obs-off",
                        "server: {metrics: false, dashboard: false}\n"
                        "request_log: {enabled: false}\n",
                        "fleetgate-metrics-log", "server: {dashboard: false}\n", None,
                        "metrics and request log on / all off (dashboard off in both)"),
    "request-log": Pair("fleetgate-log-off", "request_log: {enabled: false}\n",
                        "fleetgate", "", None, "the request log on / off (metrics on)"),
    # {otlp}: a local receiver that drops what it gets (otlp_sink.py), started for this pair.
    "tracing": Pair("fleetgate", "", "fleetgate+tracing",
                    "tracing: {enabled: true, sample: 0.1, endpoint: '{otlp}'}\n", None,
                    "tracing at 10% sampling on / off (metrics and request log on)"),
}  # fmt: skip


def measure_pair(
    pair: Pair, pool: str, seconds: float, upstream_pid: int
) -> dict[str, dict[str, float]]:
    """Both gateways of `pair` at once, measured window by window in turn."""
    files, cmds, ports = [], [], []
    sides = ((pair.base, pair.base_command), (pair.other, (PY, "-m", "fleetgate")))
    for extra, command in sides:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as cfg:
            cfg.write(pool + extra)
        port = free_port()
        files.append(cfg.name)
        ports.append(port)
        cmds.append([*_pin(0), *command, "serve", "--config", cfg.name, "--port", str(port)])
    try:
        with (
            _serving(cmds[0], f"http://127.0.0.1:{ports[0]}/healthz") as base,
            _serving(cmds[1], f"http://127.0.0.1:{ports[1]}/healthz") as other,
        ):
            print(f"through fleetgate, {pair.base_name} and {pair.other_name} in turn ...",
                  flush=True)  # fmt: skip
            targets: list[tuple[str, int | None, str | None]] = [
                (f"http://127.0.0.1:{ports[0]}", base.pid, None),
                (f"http://127.0.0.1:{ports[1]}", other.pid, pair.key),
            ]
            first, second = measure_alternately(targets, seconds, upstream_pid, pair.rounds)
            print(f"  {pair.base_name} and {pair.other_name} loaded at once ...", flush=True)
            shared = measure_at_once(targets, seconds)
            for figures, (rps, cpu_us) in zip((first, second), shared, strict=True):
                figures["shared_rps"], figures["cpu_us"] = rps, cpu_us
    finally:
        for name in files:
            os.unlink(name)
    return {pair.base_name: first, pair.other_name: second}


def _wrk_start(
    url: str, body: str, conns: int, seconds: float, latency: bool = False, key: str | None = None
) -> tuple[subprocess.Popen[str], str]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(
            f"wrk.method = 'POST'\nwrk.body = '{body}'\n"
            "wrk.headers['Content-Type'] = 'application/json'\n"
        )
        if key is not None:
            script.write(f"wrk.headers['Authorization'] = 'Bearer {key}'\n")
    cmd = [*_pin(1), "wrk", "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", "-s", script.name]
    if latency:
        cmd.append("--latency")
    proc = subprocess.Popen([*cmd, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, script.name


def _wrk_finish(proc: subprocess.Popen[str], script: str) -> str:
    out, err = proc.communicate()
    os.unlink(script)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, out, err)
    if "Non-2xx" in out or "Socket errors" in out:
        print(f"  warning: wrk saw errors:\n{out}", file=sys.stderr)
    return out


def _wrk(
    url: str, body: str, conns: int, seconds: float, latency: bool = False, key: str | None = None
) -> str:
    return _wrk_finish(*_wrk_start(url, body, conns, seconds, latency, key))


def _rps(out: str) -> float:
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    return float(match.group(1)) if match else 0.0


def _requests(out: str) -> int:
    match = re.search(r"(\d+) requests in", out)
    return int(match.group(1)) if match else 0


def _p50_us(out: str) -> float:
    match = re.search(r"50%\s+([\d.]+)(us|ms|s)\b", out)
    if not match:
        return float("nan")
    scale = {"us": 1.0, "ms": 1e3, "s": 1e6}[match.group(2)]
    return float(match.group(1)) * scale


def _repin(pid: int, core: int) -> None:
    if _pin(core):
        subprocess.run(
            ["taskset", "-p", "-c", str(core), str(pid)], capture_output=True, check=True
        )


NGINX_CONF = """
daemon off; worker_processes 1; pid {tmp}/nginx.pid; error_log {tmp}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}; proxy_temp_path {tmp};
  upstream up {{ server 127.0.0.1:{up}; keepalive 512; }}
  server {{
    listen 127.0.0.1:{port};
    location /healthz {{ return 200 ok; }}
    location / {{
      proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


def measure(
    url: str, seconds: float, pid: int | None, upstream_pid: int, key: str | None = None
) -> dict[str, float]:
    return measure_alternately([(url, pid, key)], seconds, upstream_pid)[0]


def measure_alternately(
    targets: list[tuple[str, int | None, str | None]],
    seconds: float,
    upstream_pid: int,
    rounds: int = 3,
) -> list[dict[str, float]]:
    """Each target's figures (url, its process, its API key); with several, each window is
    run for one target after the other, `rounds` times over, and the median kept: on a shared
    VM the machine's speed drifts by more than what is compared."""
    rounds = 1 if len(targets) == 1 else rounds
    paths = [(url + "/v1/chat/completions", pid, key) for url, pid, key in targets]
    for path, _, key in paths:
        _wrk(path, CHAT, 64, 2, key=key)  # warm up: connections, caches
    rps: list[list[float]] = [[] for _ in paths]
    p50: list[list[float]] = [[] for _ in paths]
    windows: list[list[tuple[float, float]]] = [[] for _ in paths]
    for _ in range(rounds):
        for i, (path, _, key) in enumerate(paths):
            rps[i].append(_rps(_wrk(path, CHAT, 64, seconds, key=key)))
    _repin(upstream_pid, 0)
    for _ in range(rounds):
        for i, (path, _, key) in enumerate(paths):
            p50[i].append(_p50_us(_wrk(path, CHAT, 1, seconds, latency=True, key=key)))
    _repin(upstream_pid, 1)
    for _ in range(STREAM_WINDOWS):
        for i, (path, pid, key) in enumerate(paths):
            windows[i].append(_stream_window(path, seconds, pid, key))
    return [
        {
            "rps": statistics.median(rps[i]),
            "p50_us": statistics.median(p50[i]),
            "streams": statistics.median(w[0] for w in windows[i]),
            "cpu": statistics.median(w[1] for w in windows[i]),
        }
        for i in range(len(paths))
    ]


def measure_at_once(
    targets: list[tuple[str, int | None, str | None]], seconds: float, rounds: int = 5
) -> list[tuple[float, float]]:
    """Each target's req/s at c64 and its CPU per request (us), all loaded at once and
    sharing core 0, medians of `rounds` windows: the host's drift, which moves windows taken
    in turn by more than the difference measured, then slows them all alike."""
    rps: list[list[float]] = [[] for _ in targets]
    cpu_us: list[list[float]] = [[] for _ in targets]
    for _ in range(rounds):
        before = [cpu_seconds(pid) if pid else 0.0 for _, pid, _ in targets]
        loads = [_wrk_start(url + "/v1/chat/completions", CHAT, 64, seconds, key=key)
                 for url, _, key in targets]  # fmt: skip
        outs = [_wrk_finish(*load) for load in loads]
        for i, ((_, pid, _), out) in enumerate(zip(targets, outs, strict=True)):
            rps[i].append(_rps(out))
            if pid:
                used = cpu_seconds(pid) - before[i]
                cpu_us[i].append(used / max(1, _requests(out)) * 1e6)
    return [
        (statistics.median(r), statistics.median(c) if c else float("nan"))
        for r, c in zip(rps, cpu_us, strict=True)
    ]


def _stream_window(
    path: str, seconds: float, pid: int | None, key: str | None
) -> tuple[float, float]:
    """One run of the paced streams: completed streams/s, and the proxy's CPU (of one core)."""
    cpu0 = cpu_seconds(pid) if pid else 0.0
    t0 = time.monotonic()
    streams = _rps(_wrk(path, STREAM, 256, seconds, key=key))
    cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0) if pid else float("nan")
    return streams, cpu


def _nginx_worker(master: int) -> int:
    """nginx serves from its worker process; that is the one whose CPU counts."""
    children = Path(f"/proc/{master}/task/{master}/children")
    pids = children.read_text().split() if children.exists() else []
    return int(pids[0]) if pids else master


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each wrk run")
    parser.add_argument("--auth", action="store_true", help="also with keys and rate limits on")
    parser.add_argument("--pair", choices=sorted(PAIRS), help="the gateway beside another, "
                        "measured in turn: auth (= --auth), observability (metrics, the "
                        "request log and the dashboard off), metrics-log (metrics and the "
                        "request log on, the rest off), request-log (it alone off), "
                        "tracing (on at 10%% sampling, to a local OTLP receiver)")  # fmt: skip
    parser.add_argument("--baseline", metavar="REF", help="also the gateway of commit REF, "
                        "beside this tree's in the same run (docs/benchmarks.md names the "
                        "reference commit)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="windows in turn per figure "
                        "when two gateways are compared (default 3)")  # fmt: skip
    parser.add_argument(
        "--router-policy",
        default="cache_aware",
        help="sglang-router's policy, when it is on PATH (default cache_aware, its own default)",
    )
    args = parser.parse_args()
    if not shutil.which("wrk"):
        print("wrk is needed: apt-get install wrk", file=sys.stderr)
        return 2
    seconds = args.seconds
    up_port, gw_port, sg_port = free_port(), free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    results: dict[str, dict[str, float]] = {}
    up_cmd = [*_pin(1), PY, str(HERE / "fast_upstream.py"), "--port", str(up_port)]
    with _serving(up_cmd, upstream + "/v1/models") as up:
        print(f"direct to the upstream ({seconds:.0f} s per run) ...", flush=True)
        results["direct"] = measure(upstream, seconds, None, up.pid)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as cfg:
            cfg.write(f"pools:\n  - model: fast\n    backends:\n      - url: {upstream}\n")
        gw_cmd = [*_pin(0), PY, "-m", "fleetgate", "serve", "--config", cfg.name,
                  "--port", str(gw_port)]  # fmt: skip
        pair = PAIRS.get("auth" if args.auth else args.pair or "")
        if args.baseline:
            command, sha = fleetgate_command(args.baseline)
            pair = Pair("baseline", "", "fleetgate", "", None, f"this tree / {sha}",
                        tuple(command), args.rounds)  # fmt: skip
        elif pair is not None:
            pair = replace(pair, rounds=args.rounds)
        if pair is None:
            with _serving(gw_cmd, f"http://127.0.0.1:{gw_port}/healthz") as gw:
                print("through fleetgate ...", flush=True)
                url = f"http://127.0.0.1:{gw_port}"
                results["fleetgate"] = measure(url, seconds, gw.pid, up.pid)
        elif "{otlp}" in pair.other:
            sink_port = free_port()
            sink_cmd = [*_pin(1), PY, str(HERE / "otlp_sink.py"), "--port", str(sink_port)]
            with _serving(sink_cmd, f"http://127.0.0.1:{sink_port}/") as _:
                endpoint = f"http://127.0.0.1:{sink_port}/v1/traces"
                traced = replace(pair, other=pair.other.replace("{otlp}", endpoint))
                results.update(measure_pair(traced, Path(cfg.name).read_text(), seconds, up.pid))
                print(f"  the OTLP receiver took {get(f'http://127.0.0.1:{sink_port}/').strip()}"
                      " exports", flush=True)  # fmt: skip
        else:
            results.update(measure_pair(pair, Path(cfg.name).read_text(), seconds, up.pid))
        os.unlink(cfg.name)
        nginx = shutil.which("nginx") or (
            "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
        )
        if nginx:
            ng_port = free_port()
            with tempfile.TemporaryDirectory() as tmp:
                conf = Path(tmp) / "nginx.conf"
                conf.write_text(NGINX_CONF.format(tmp=tmp, up=up_port, port=ng_port))
                ng_cmd = [*_pin(0), nginx, "-c", str(conf), "-e", f"{tmp}/error.log"]
                with _serving(ng_cmd, f"http://127.0.0.1:{ng_port}/healthz") as ng:
                    print("through nginx ...", flush=True)
                    results["nginx"] = measure(
                        f"http://127.0.0.1:{ng_port}", seconds, _nginx_worker(ng.pid), up.pid
                    )
        router = shutil.which("sglang-router")
        if router:
            sg_cmd = [*_pin(0), router, "launch", "--host", "127.0.0.1", "--port", str(sg_port),
                      "--worker-urls", upstream, "--policy", args.router_policy]  # fmt: skip
            with _serving(sg_cmd, f"http://127.0.0.1:{sg_port}/health") as sg:
                print("through sglang-router ...", flush=True)
                results["sglang-router"] = measure(
                    f"http://127.0.0.1:{sg_port}", seconds, sg.pid, up.pid
                )
    report(results, pair.line if args.baseline and pair is not None else "")
    return 0


def report(results: dict[str, dict[str, float]], baseline: str = "") -> None:
    """Every figure beside the direct one; `baseline`: what the baseline ratios are called."""
    direct = results["direct"]
    order = ("baseline", "fleetgate-obs-off", "fleetgate-log-off", "fleetgate-metrics-log",
             "fleetgate",
             "fleetgate+auth", "fleetgate+tracing", "nginx", "sglang-router")  # fmt: skip
    names = [n for n in order if n in results]
    print()
    print(f"{'':34}{'direct':>10}" + "".join(f"{n:>15}" for n in names))
    rows = [
        ("req/s at c64 (JSON POST)", "rps", "{:,.0f}", "target >= 7,000"),
        ("p50 latency at c1 (us)", "p50_us", "{:,.0f}", "target: added <= 150 us"),
        ("paced streams/s (offered 1,280)", "streams", "{:,.0f}", "target: the offered rate"),
    ]
    for label, key, fmt, target in rows:
        line = f"{label:34}{fmt.format(direct[key]):>10}"
        for n in names:
            value = results[n][key]
            extra = (
                f"+{value - direct[key]:,.0f}" if key == "p50_us" else f"{value / direct[key]:.2f}x"
            )
            line += f"{fmt.format(value) + ' (' + extra + ')':>15}"
        print(line + "   " + target)
    line = f"{'proxy CPU while streaming':34}{'':>10}"
    for n in names:
        line += f"{results[n]['cpu']:>15.0%}"
    print(line + "   target < 50% of a core")
    if "nginx" in results and "fleetgate" in results:
        gw, ng = results["fleetgate"], results["nginx"]
        print(f"\nfleetgate / nginx: {gw['rps'] / ng['rps']:.2f}x the req/s, "
              f"{gw['cpu'] / ng['cpu']:.2f}x the CPU per streamed answer")  # fmt: skip
    if baseline:
        report_baseline(results, baseline)
    for pair in PAIRS.values():
        if pair.base_name in results and pair.other_name in results:
            base, other = results[pair.base_name], results[pair.other_name]
            print(f"{pair.line}: {other['shared_rps'] / base['shared_rps']:.3f}x the req/s "
                  f"loaded at once ({base['cpu_us']:.1f} / {other['cpu_us']:.1f} us of CPU a "
                  f"request: {base['cpu_us'] / other['cpu_us']:.3f}x), "
                  f"{other['rps'] / base['rps']:.2f}x loaded in turn, "
                  f"{other['p50_us'] - base['p50_us']:+,.0f} us at p50, "
                  f"{other['cpu'] / base['cpu']:.2f}x the CPU per streamed answer "
                  "(target: req/s >= 0.92x, issue 28)")  # fmt: skip
    if "sglang-router" in results and "fleetgate" in results:
        gw, sg = results["fleetgate"], results["sglang-router"]
        print(f"fleetgate / sglang-router: {gw['rps'] / sg['rps']:.2f}x the req/s (target >= "
              f"1.3x), added p50 {gw['p50_us'] - direct['p50_us']:+,.0f} / "
              f"{sg['p50_us'] - direct['p50_us']:+,.0f} us (target: no higher)")  # fmt: skip
    if "sglang-router" not in results:
        print("sglang-router: not installed (pip install sglang-router to compare)")


def report_baseline(results: dict[str, dict[str, float]], line: str) -> None:
    """This tree beside the baseline commit: the ratios docs/benchmarks.md holds it to."""
    direct, base, now = results["direct"], results["baseline"], results["fleetgate"]
    added_now, added_base = now["p50_us"] - direct["p50_us"], base["p50_us"] - direct["p50_us"]
    print(
        f"{line}: {now['rps'] / base['rps']:.3f}x the req/s at c64 in turn "
        f"(target >= 0.95x), {now['shared_rps'] / base['shared_rps']:.3f}x loaded at once "
        f"({base['cpu_us']:.1f} / {now['cpu_us']:.1f} us of CPU a request); added p50 at c1 "
        f"{added_now:+,.0f} us against {added_base:+,.0f} us ({added_now - added_base:+,.0f};"
        f" target within +10); {now['cpu'] / base['cpu']:.2f}x the CPU per streamed answer"
    )


if __name__ == "__main__":
    raise SystemExit(main())
