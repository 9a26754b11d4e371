"""What the request lifecycle's events cost per request, beside the bookkeeping they carry.

    .venv/bin/python benchmarks/event_cost.py [--requests 200000]

Per request (a non-streamed answer, as most of the overhead benchmark's are): the events the
gateway emits (Received, Admitted, Routed, AttemptStarted, AttemptEnded, Finished) made and
handed to the subscribers the gateway runs with (fleet accounting, outlier detector, hedge
TTFT window, Prometheus metrics), built by the same composition code (serve.build_clusters).
The reference in the same run is the bookkeeping alone, called directly as the proxy did
before the events (pool.begin, pool.end, an outlier success, a latency sample): the difference
is what making and dispatching the events adds.
"""

from __future__ import annotations

import argparse
import random
import time

from fleetgate.clock import LoopClock
from fleetgate.config import parse_config
from fleetgate.fleet.backend import Backend
from fleetgate.health.outlier import OutlierDetector, OutlierSettings
from fleetgate.http.client import HttpClient
from fleetgate.lifecycle.events import (
    Admitted,
    AttemptEnded,
    AttemptStarted,
    Finished,
    Received,
    Routed,
)
from fleetgate.lifecycle.hooks import Emitters, Hooks
from fleetgate.observe.metrics import GatewayMetrics
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.registry import default_registry
from fleetgate.serve import ResolvedPool, build_clusters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    n = parser.parse_args().requests
    config = parse_config({"pools": [{"model": "m", "backends": [{"url": "http://h:1"}]}]})
    backend = Backend("h:1", "http://h:1", ("m",))
    metrics = GatewayMetrics(lambda: ())
    cluster = build_clusters(
        [ResolvedPool(config.pools[0], (backend,))], default_registry(), random.Random(0),
        transport=HttpClient(), clock=LoopClock(), subscribe=metrics.subscribe,
    )["m"]  # fmt: skip
    edge = Hooks()
    metrics.subscribe(edge)
    gateway, emit = Emitters(edge), cluster.emit
    pool = cluster.pool
    state = pool.states[0]
    backend_id = state.backend.id  # how events name it
    routing = RoutingRequest("m", "chat", False, 8, None, b"x" * 64)
    rid = b"abc-1"

    received, admitted = gateway.received, gateway.admitted
    routed, started, ended, finished = (
        emit.routed,
        emit.attempt_started,
        emit.attempt_ended,
        emit.finished,
    )
    assert started is not None and ended is not None and finished is not None

    def events(count: int) -> float:
        """As the gateway emits them: an event nobody hears is not made."""
        start = time.perf_counter()
        for i in range(count):
            t = float(i)
            if received is not None:
                received(Received(rid, t, b"/v1/chat/completions"))
            if admitted is not None:
                admitted(Admitted(rid, t, "m", routing))
            if routed is not None:
                routed(Routed(rid, t, "m", backend_id, "first", {}))
            started(AttemptStarted(rid, t, "m", backend_id, "first", 16, 0))
            ended(
                AttemptEnded(
                    rid, t, "m", backend_id, "first", t, 16, 0, 200, None, None, None, 0, False
                )
            )
            finished(Finished(rid, t, "m", t, 200, "h:1", "answered", None, None))
        return (time.perf_counter() - start) / count * 1e6

    outliers = OutlierDetector(OutlierSettings(), pool)

    def direct(count: int) -> float:
        start = time.perf_counter()
        for i in range(count):
            t = float(i)
            pool.begin(backend_id, t, 16)
            pool.end(backend_id, t, 16, 16)
            outliers.success(state, t)
            state.latency.record_response(0.001)
        return (time.perf_counter() - start) / count * 1e6

    events(n // 10)
    direct(n // 10)  # warm both
    ev = min(events(n) for _ in range(3))
    ref = min(direct(n) for _ in range(3))
    print(f"per request, over {n:,} requests (best of 3):")
    print(f"  events through the gateway's subscribers (metrics included): {ev:.2f} us")
    print(f"  the fleet bookkeeping alone, called directly (reference):     {ref:.2f} us")
    print(f"  ratio: {ev / ref:.2f}x; what events and metrics add: {ev - ref:.2f} us")


if __name__ == "__main__":
    main()
