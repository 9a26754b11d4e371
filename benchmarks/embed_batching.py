"""What dynamic batching buys the embed worker: the same rising load on it with batching on (its
defaults: up to 32 inputs a batch) and off (`--max-batch-size 1`), side by side.

    .venv/bin/python benchmarks/embed_batching.py [--clients 1,4,16,32] [--step-seconds 4]
                                                  [--p99-ms 100]

Each configuration is one `fleetgate worker embed` process on a free localhost port; both run
at once and are measured in turn, step by step. Load is closed-loop: N clients, each sending
one single-sentence request as soon as its last one is answered, for a fixed time per step
(and at most 10 s of waiting per request), N rising step by step. Per step it prints texts/s,
p50 and p99 latency, and the mean batch size the worker ran (from its /metrics). The headline:
the highest throughput each configuration reached with p99 within `--p99-ms`, and their ratio.
Client and workers share this machine's cores (each worker's model uses one thread), so the
figures are for this machine as it was during the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvloop
from harness import PY, drain, get, metric, process, read_until, wait_http

from fleetgate.http.client import HttpClient, Origin

_JSON = [(b"content-type", b"application/json")]
_TOPICS = ("the weather", "a football match", "stock prices", "a new recipe", "the train")


@dataclass(frozen=True)
class Step:
    clients: int
    texts_per_s: float
    p50_ms: float
    p99_ms: float
    mean_batch: float
    errors: int


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _client(http: HttpClient, origin: Origin, ident: int, until: float,
                  latencies: list[float], errors: list[int]) -> None:  # fmt: skip
    n = 0
    while time.monotonic() < until:
        text = f"client {ident} asks, for the {n}th time, about {_TOPICS[n % len(_TOPICS)]}"
        body = json.dumps({"input": text}).encode()
        started = time.monotonic()
        try:
            response = await http.request(origin, b"POST", b"/v1/embeddings", _JSON, body,
                                          timeout_s=10.0)  # fmt: skip
            await asyncio.wait_for(response.read(), 10.0)
            ok = response.status == 200
        except Exception:  # refused, reset, timed out: counted as an error, the run goes on
            ok = False
        if ok:
            latencies.append(time.monotonic() - started)
        else:
            errors.append(1)
        n += 1


async def _step(url: str, clients: int, seconds: float) -> Step:
    origin = Origin.parse(url)
    http = HttpClient()
    before = get(url + "/metrics")
    latencies: list[float] = []
    errors: list[int] = []
    started = time.monotonic()
    until = started + seconds
    await asyncio.gather(
        *(_client(http, origin, i, until, latencies, errors) for i in range(clients))
    )
    elapsed = time.monotonic() - started
    await http.close()
    after = get(url + "/metrics")
    batches = metric(after, "fleetgate_embed:batch_size_count") - metric(
        before, "fleetgate_embed:batch_size_count"
    )
    items = metric(after, "fleetgate_embed:batch_size_sum") - metric(
        before, "fleetgate_embed:batch_size_sum"
    )
    return Step(clients, len(latencies) / elapsed, 1000 * _percentile(latencies, 0.5),
                1000 * _percentile(latencies, 0.99), items / batches if batches else 0.0,
                len(errors))  # fmt: skip


@contextmanager
def _worker(extra: list[str]) -> Iterator[str]:
    args = [PY, "-m", "fleetgate", "worker", "embed", "--port", "0", *extra]
    with process(args) as worker:
        url = read_until(worker, r"on (http://\S+)").group(1)
        drain(worker)
        wait_http(url + "/health")
        uvloop.run(_step(url, 4, 2.0))  # warm up: a session's first runs of each shape are slow
        yield url


def _row(name: str, s: Step) -> str:
    return (f"{name:<10}{s.clients:>8}{s.texts_per_s:>10.0f}{s.p50_ms:>9.1f}{s.p99_ms:>9.1f}"
            f"{s.mean_batch:>12.1f}{s.errors:>8}")  # fmt: skip


def _best(steps: list[Step], bound_ms: float) -> Step | None:
    within = [s for s in steps if s.p99_ms <= bound_ms and not s.errors]
    return max(within, key=lambda s: s.texts_per_s, default=None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,4,16,32", help="comma-separated, rising")
    parser.add_argument("--step-seconds", type=float, default=4.0)
    parser.add_argument("--p99-ms", type=float, default=100.0, help="the latency bound compared")
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    print(f"{'batching':<10}{'clients':>8}{'texts/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'mean batch':>12}{'errors':>8}")  # fmt: skip
    on: list[Step] = []
    off: list[Step] = []
    # Both at once, measured step by step in turn: a shared machine's speed drifts between
    # runs by more than the difference measured (benchmarks/overhead.py does the same).
    with _worker([]) as url_on, _worker(["--max-batch-size", "1"]) as url_off:
        for clients in levels:
            for name, url, steps in (("on", url_on, on), ("off (1)", url_off, off)):
                steps.append(uvloop.run(_step(url, clients, args.step_seconds)))
                print(_row(name, steps[-1]), flush=True)
    best_on, best_off = _best(on, args.p99_ms), _best(off, args.p99_ms)
    print(f"\nhighest throughput with p99 <= {args.p99_ms:g} ms:")
    for name, best in (("batching on", best_on), ("batching off", best_off)):
        said = "none"
        if best is not None:
            said = f"{best.texts_per_s:.0f} texts/s ({best.clients} clients,"
            said += f" p99 {best.p99_ms:.0f} ms)"
        print(f"  {name:<13}{said}")
    if best_on is not None and best_off is not None:
        print(f"  ratio: {best_on.texts_per_s / best_off.texts_per_s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
