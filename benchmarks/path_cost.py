"""What the gateway's own request path costs per request, in-process, without sockets: with
API keys and rate limits off and on (or observability off and on), measured alternately in one
run, printed as a ratio.

    .venv/bin/python benchmarks/path_cost.py [--requests 50000] [--rounds 5]
                                             [--pair keys|observability]

Each request runs the whole path the gateway runs (parse, the front door, admission, routing,
one attempt through the transport, the answer written, the events and their subscribers:
fleet accounting, outlier detection, metrics), built by the composition root (serve.compose)
from a config; the transport is a mock that answers at once with a canned chat completion, and
the client's connection a sink. So the figure is the gateway's Python work alone, which the
wrk-driven overhead benchmark (benchmarks/overhead.py) measures with the network on top.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from fleetgate.clock import LoopClock
from fleetgate.config import parse_config
from fleetgate.fleet.backend import Backend
from fleetgate.gateway.app import Gateway
from fleetgate.http.mock import MockTransport, Script, Sent
from fleetgate.http.server import Request
from fleetgate.http.writer import ResponseWriter
from fleetgate.observe.request_log import RequestLog, RequestLogSettings
from fleetgate.runtime import settle_heap
from fleetgate.serve import ResolvedPool, compose


class Nowhere:
    """A client connection that takes every write and never pushes back."""

    closed = False
    paused = False

    def write(self, data: bytes) -> None:
        pass

    def writelines(self, parts: tuple[bytes, bytes]) -> None:
        pass

    async def drain(self) -> None:
        pass

    def when_drained(self, callback: Callable[[], None]) -> None:
        callback()

    def abort(self) -> None:
        pass


KEY = "sk-path-cost-benchmark"
BODY = b'{"model":"fast","messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
ANSWER = (
    b'{"id":"c","object":"chat.completion","created":1,"model":"fast","choices":[{"index":0,'
    b'"finish_reason":"length","message":{"role":"assistant","content":"hello there"}}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":8,"total_tokens":11}}'
)
LIMITED = {
    "tenants": [{"name": "bench", "keys": [KEY],
                 "limits": {"requests_per_minute": 1e12, "tokens_per_minute": 1e15}}],
}  # fmt: skip


def build(extra: dict[str, Any], request_log: RequestLog | None = None) -> Gateway:
    url = "http://127.0.0.1:9"
    config = parse_config({
        "pools": [{"model": "fast", "backends": [{"url": url}],
                   "health_check": {"enabled": False}, "engine_metrics": {"enabled": False}}],
        **extra,
    })  # fmt: skip
    script = Script(200, chunks=[ANSWER], headers=[(b"content-type", b"application/json")])

    def answer(sent: Sent) -> Script:
        return script

    backend = Backend("127.0.0.1:9", url, ("fast",))
    gateway, _ = compose(
        config, [ResolvedPool(config.pools[0], (backend,))], transport=MockTransport(answer),
        clock=LoopClock(), rng=random.Random(0), request_log=request_log,
    )  # fmt: skip
    return gateway


async def per_request_us(gateway: Gateway, headers: dict[bytes, bytes], n: int) -> float:
    sink = Nowhere()
    path = b"/v1/chat/completions"
    handle = gateway.handle
    started = time.perf_counter()
    for _ in range(n):
        request = Request(b"POST", path, b"", dict(headers), BODY, True, False)
        await handle(request, ResponseWriter(sink, keep_alive=True))
    return (time.perf_counter() - started) / n * 1e6


def null_request_log() -> RequestLog:
    """The request log as the gateway runs it, its lines written nowhere."""

    return RequestLog(RequestLogSettings(), lambda lines: None, False, LoopClock().call_later)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--pair", choices=("keys", "observability"), default="keys",
        help="keys: API keys and rate limits off / on; observability: metrics, the dashboard's "
        "live view and the request log (writing nowhere) all off / all on",
    )  # fmt: skip
    args = parser.parse_args()
    base = {b"content-type": b"application/json", b"host": b"gw"}
    if args.pair == "keys":
        what = "keys and limits"
        off_side, on_side = build({}), build(LIMITED)
        off_headers, on_headers = base, {**base, b"authorization": f"Bearer {KEY}".encode()}
    else:
        what = "observability"
        off_side = build({"server": {"metrics": False, "dashboard": False}})
        on_side = build({}, null_request_log())
        off_headers = on_headers = base
    settle_heap()  # as the server does once it has started
    await per_request_us(off_side, off_headers, 2000)  # warm up
    await per_request_us(on_side, on_headers, 2000)
    off, on = [], []
    for _ in range(args.rounds):
        off.append(await per_request_us(off_side, off_headers, args.requests))
        on.append(await per_request_us(on_side, on_headers, args.requests))
    a, b = statistics.median(off), statistics.median(on)
    for label, median, rounds in (("off", a, off), ("on ", b, on)):
        each = ", ".join(f"{x:.2f}" for x in rounds)
        print(f"{what} {label}: {median:.2f} us/request   (rounds: {each})")
    print(f"on / off: {b / a:.2f}x the time per request (+{b - a:.2f} us)")


if __name__ == "__main__":
    asyncio.run(main())
