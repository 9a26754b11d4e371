"""A region dies under load and comes back, live: does traffic leave it within 2 s, with no
request lost and no stream broken, does a tenant pinned to it stay in it, and does traffic
return without flapping?

    .venv/bin/python benchmarks/regions.py [--seconds 75] [--kill-at 20] [--back-at 40]
                                           [--rate 3] [--out DIR]

Three regions of sim workers (eu, us, ap: three each, each its own process); `ap`'s answer
`--ap-latency-s` later, health checks included (the distance to it, injected at its sims,
as both gateways see it: `--network-delay`).
Two gateways on one Redis (`state.url`): `gw-eu` (server.region eu) and `gw-us` (us), each
routing its pool by locality, with a short recovery (`--hold-s`, `--shift-s`) so the run
shows the return. Clients in each region (`fleetgate bench`, open-loop Poisson): streams of
64 tokens at `--rate` req/s to each gateway, and whole (non-streamed) answers at `--rate`
req/s to gw-eu; a tenant whose data must stay in eu (`tenants[].regions: [eu]`) streams at
1 req/s through gw-us the whole time. At `--kill-at` every eu worker is SIGKILLed; at
`--back-at` they start again on the same ports.

Measured: per client group, TTFT p99 in 5-second windows (the outage marked); requests
failed (non-streamed: lost) and streams broken; how long gw-eu took to take its region out of
rotation (its `fleetgate_region_phase`, polled every 0.1 s from the kill); its phases after
the workers returned (down -> holding -> returning -> up, never down again: no flapping);
the pinned tenant's requests served outside eu (gw-us's request log; must be 0) and refused
while eu was down (503 region_unavailable: residency, not loss). Each goal is printed beside
its figure; the exit status is 1 when one is not met. With --out, ttft.png (TTFT p99 over
time by client group, the outage shaded) and results.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from harness import PY, drain, free_port, gateway, get, metric, read_until, redis_server

MODEL = "sim-8b"
REGIONS = ("eu", "us", "ap")
WORKERS = 3  # per region
ANSWER = 64
WINDOW_S = 5.0
APP_KEY, PINNED_KEY = "k-app-0123456789", "k-eu-0123456789"
PHASES = ("up", "down", "holding", "returning")


class Workers:
    """A region's sim workers, each its own process on a port fixed for the run (a restart
    comes back where the gateways look for it)."""

    def __init__(self, region: str, added_latency_s: float) -> None:
        self.region = region
        self.ports = [free_port() for _ in range(WORKERS)]
        self._latency = added_latency_s
        self._procs: list[subprocess.Popen[str]] = []

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def start(self) -> None:
        for port in self.ports:
            args = [PY, "-m", "fleetgate", "worker", "sim", "--port", str(port), "--model", MODEL]
            if self._latency:  # every answer, health checks included: the way there and back
                args += ["--network-delay", str(self._latency)]
            proc = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            read_until(proc, r"on http://127\.0\.0\.1:(\d+)")
            drain(proc)
            self._procs.append(proc)

    def kill(self) -> None:
        """SIGKILL: a region lost at once, nothing drained."""
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.wait()
        self._procs.clear()


@contextmanager
def fleet(ap_latency_s: float) -> Iterator[dict[str, Workers]]:
    regions = {r: Workers(r, ap_latency_s if r == "ap" else 0.0) for r in REGIONS}
    try:
        for workers in regions.values():
            workers.start()
        yield regions
    finally:
        for workers in regions.values():
            workers.kill()


def gateway_config(
    region: str, regions: dict[str, Workers], redis_url: str, log: Path, args: argparse.Namespace
) -> dict[str, Any]:
    backends = [
        {"url": url, "labels": {"region": w.region}} for w in regions.values() for url in w.urls
    ]
    locality = {"type": "locality", "recovery": {"hold_s": args.hold_s, "shift_s": args.shift_s}}
    return {
        "server": {"region": region, "admin": True},
        "tenants": [
            {"name": "app", "keys": [APP_KEY], "models": ["*"]},
            {"name": "eu-data", "keys": [PINNED_KEY], "models": ["*"], "regions": ["eu"]},
        ],
        "state": {"url": redis_url},
        "request_log": {"path": str(log), "format": "json"},
        "pools": [{
            "model": MODEL, "backends": backends, "health_check": {"interval_s": 0.5},
            "routing": {"filters": [locality], "scorers": [{"type": "queue", "weight": 1}]},
        }],
    }  # fmt: skip


class PhaseWatch:
    """The phase gw-eu's region is in, polled every 0.1 s: (seconds since `start`, phase) at
    each change."""

    def __init__(self, url: str, start: float) -> None:
        self.changes: list[tuple[float, str]] = []
        self._url, self._start = url, start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.1):
            try:
                text = get(self._url + "/metrics")
            except OSError:
                continue
            now = next((p for p in PHASES if metric(text, "fleetgate_region_phase", phase=p)), None)
            if now is not None and (not self.changes or self.changes[-1][1] != now):
                self.changes.append((time.monotonic() - self._start, now))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def first_request(url: str) -> float:
    """When the gateway at `url` first counted a request (polled every 20 ms)."""
    while metric(get(url + "/metrics"), "fleetgate_requests_total") == 0:
        time.sleep(0.02)
    return time.monotonic()


def bench(url: str, key: str, out: Path, args: argparse.Namespace, *, rate: float,
          stream: bool) -> subprocess.Popen[bytes]:  # fmt: skip
    command = [
        PY, "-m", "fleetgate", "bench", "--target", url, "--api-key", key, "--model", MODEL,
        "--workload", "synthetic", "--input-len", "256", "--output-len", str(ANSWER),
        "--rate", str(rate), "--duration", str(args.seconds), "--grace", "30", "--quiet",
        "--out", str(out), "--save-requests", "--seed", str(len(str(out))),
    ]  # fmt: skip
    if not stream:
        command.append("--no-stream")
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def records(out: Path) -> list[dict[str, Any]]:
    lines = (out / "requests.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def windows(rows: list[dict[str, Any]]) -> list[tuple[float, float | None]]:
    """TTFT p99 (ms) of the requests answered that were sent in each WINDOW_S window (of
    whole answers, not streamed: the end-to-end time, their first byte)."""
    by: dict[int, list[float]] = {}
    for r in rows:
        first = r["ttft_s"] if r["ttft_s"] is not None else r["e2e_s"]
        if first is not None and not r["error"]:
            by.setdefault(int(r["sent_s"] // WINDOW_S), []).append(first * 1e3)
    last = max(by, default=-1)
    return [(i * WINDOW_S, p99(by.get(i, []))) for i in range(last + 1)]


def residency(log: Path, regions_of: dict[str, str]) -> tuple[int, int, int]:
    """The pinned tenant's requests in a request log: answered in eu, outside it, refused."""
    inside = outside = refused = 0
    for line in log.read_text().splitlines():
        doc = json.loads(line)
        if doc.get("tenant") != "eu-data":
            continue
        if "backend" in doc and doc.get("status", 0) < 500:
            if regions_of.get(doc["backend"]) == "eu":
                inside += 1
            else:
                outside += 1
        elif doc.get("reason") == "region_unavailable" or doc.get("status") == 503:
            refused += 1
    return inside, outside, refused


def plot(path: Path, series: dict[str, list[tuple[float, float | None]]], args: argparse.Namespace
         ) -> None:  # fmt: skip
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.axvspan(args.kill_at, args.back_at, color="tab:red", alpha=0.15, label="eu down")
    for name, points in series.items():
        xs = [t + WINDOW_S / 2 for t, v in points if v is not None]
        axes.plot(xs, [v for _, v in points if v is not None], marker="o", label=name)
    axes.set_xlabel("seconds (request sent)")
    axes.set_ylabel(f"TTFT p99 per {WINDOW_S:g} s (ms)")
    axes.legend()
    figure.savefig(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=75.0)
    parser.add_argument("--kill-at", type=float, default=20.0)
    parser.add_argument("--back-at", type=float, default=40.0)
    parser.add_argument("--rate", type=float, default=3.0)
    parser.add_argument("--ap-latency-s", type=float, default=0.05)
    parser.add_argument("--hold-s", type=float, default=5.0)
    parser.add_argument("--shift-s", type=float, default=10.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as stack:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        redis = stack.enter_context(redis_server())
        regions = stack.enter_context(fleet(args.ap_latency_s))
        urls = {}
        for region in ("eu", "us"):
            config = out / f"gw-{region}.json"
            log = out / f"gw-{region}.log"
            config.write_text(json.dumps(gateway_config(region, regions, redis.url, log, args)))
            urls[region] = stack.enter_context(gateway(config))[0]
        regions_of = {  # backend id (host:port), as the request log names it -> its region
            url.removeprefix("http://"): w.region for w in regions.values() for url in w.urls
        }
        groups = (  # (name, gateway, key, out dir, rate, streamed)
            ("eu clients, streams", "eu", APP_KEY, "eu-stream", args.rate, True),
            ("eu clients, whole answers", "eu", APP_KEY, "eu-whole", args.rate, False),
            ("us clients, streams", "us", APP_KEY, "us-stream", args.rate, True),
            ("eu-pinned tenant via gw-us", "us", PINNED_KEY, "pinned", 1.0, True),
        )
        runs = {
            name: bench(urls[gw], key, out / d, args, rate=rate, stream=streamed)
            for name, gw, key, d, rate, streamed in groups
        }
        start = first_request(urls["eu"])  # the clients' time 0, near enough (their start-up)
        watch = PhaseWatch(urls["eu"], start)
        time.sleep(max(0.0, start + args.kill_at - time.monotonic()))
        killed = time.monotonic() - start
        regions["eu"].kill()
        time.sleep(max(0.0, start + args.back_at - time.monotonic()))
        back = time.monotonic() - start
        regions["eu"].start()
        for run in runs.values():
            run.wait()
        watch.stop()
        time.sleep(0.5)  # the request logs' last lines
        rows = {name: records(out / d) for name, _, _, d, _, _ in groups}
        pinned = residency(out / "gw-us.log", regions_of)
        met = report(args, rows, watch.changes, (killed, back), pinned)
        if args.out is not None:
            plot(out / "ttft.png", {n: windows(r) for n, r in rows.items()}, args)
            results = {
                "phases": watch.changes,
                "killed_s": killed,
                "back_s": back,
                "pinned": pinned,
                "ttft_p99_ms": {n: windows(r) for n, r in rows.items()},
            }
            (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0 if met else 1


def report(
    args: argparse.Namespace,
    rows: dict[str, list[dict[str, Any]]],
    changes: list[tuple[float, str]],
    outage: tuple[float, float],
    pinned: tuple[int, int, int],
) -> bool:
    """Print the figures beside their goals; whether every goal is met."""
    killed, back = outage
    print(f"eu's workers SIGKILLed at {killed:.1f} s, started again at {back:.1f} s")
    print(
        "\nTTFT p99 (ms; whole answers: E2E) by the 5-second window each request was sent in"
        " (* eu down):"
    )
    table = {name: dict(windows(r)) for name, r in rows.items()}
    print("     t  " + "".join(f"{name[:26]:>28s}" for name in rows))
    for t in sorted({t for w in table.values() for t in w}):
        mark = "*" if killed - WINDOW_S < t < back else " "
        cells = [table[name].get(t) for name in rows]
        print(f"  {t:4.0f}{mark} " + "".join(
            f"{'-' if v is None else f'{v:.0f}':>28s}" for v in cells))  # fmt: skip
    lost = broken = 0
    for name, group in rows.items():
        failed = [r for r in group if r["error"]]
        short = [r for r in group if not r["error"] and r["output_tokens"] < ANSWER]
        print(f"\n{name}: {len(group)} requests, {len(failed)} failed, {len(short)} broken")
        if name.startswith("eu-pinned"):
            continue  # its refusals while eu is down are residency's, counted below
        lost += len(failed)
        broken += len(short)
    down = [t for t, phase in changes if phase == "down" and t >= killed]
    failover = down[0] - killed if down else float("inf")
    after = [phase for t, phase in changes if t >= back]
    flapped = "down" in after[after.index("holding") :] if "holding" in after else True
    returned = next((t - back for t, phase in changes if t >= back and phase == "up"), None)
    inside, outside, refused = pinned
    print(f"\ngw-eu's region phases: {', '.join(f'{p} at {t:.1f} s' for t, p in changes)}")
    cut = sum(1 for r in rows["eu-pinned tenant via gw-us"] if r["error"]) - refused
    print(f"eu-pinned tenant: {inside} served in eu, {outside} outside, {refused} refused "
          f"(503 region_unavailable) while eu was down, {cut} failed in flight at the kill "
          "(no retry may leave eu)")  # fmt: skip
    goals = (
        ("traffic out of eu after the kill", f"{failover:.2f} s", "<= 2 s", failover <= 2.0),
        ("requests lost (failed)", str(lost), "0", lost == 0),
        ("streams broken", str(broken), "0", broken == 0),
        ("pinned tenant served outside eu", str(outside), "0", outside == 0),
        ("return without flapping", "no" if flapped else
         f"yes, up {returned:.1f} s after restart" if returned is not None else "not up",
         "up, never down again", not flapped and returned is not None),
    )  # fmt: skip
    print()
    for what, figure, goal, ok in goals:
        print(f"  {what:34s} {figure:>30s}   goal {goal:20s} {'met' if ok else 'NOT MET'}")
    return all(ok for *_, ok in goals)


if __name__ == "__main__":
    sys.exit(main())
