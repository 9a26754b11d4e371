"""Hosting sim workers: several in one process (`--replicas`), and that process started beside
the gateway for `fleetgate serve`'s built-in fleet, so they never share its event loop."""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import random
import signal
import sys

from fleetgate.runtime import settle_heap
from fleetgate.workers.sim.spec import SimSpec


async def serve_specs(
    specs: list[SimSpec],
    host: str,
    *,
    announce: bool = False,
    ready: multiprocessing.connection.Connection | None = None,
    stop_signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM),
) -> int:
    """Serve every spec in this process until one of `stop_signals`."""
    from zmq import ZMQError

    from fleetgate.workers.sim.worker import SimWorker

    loop = asyncio.get_running_loop()
    workers = [SimWorker(spec, random.Random(spec.seed), loop) for spec in specs]
    servers = []
    try:
        for worker, spec in zip(workers, specs, strict=True):
            servers.append(await worker.start(host, spec.port))
    except (OSError, ZMQError) as exc:
        print(f"fleetgate worker: cannot listen: {exc}", file=sys.stderr)
        if ready is not None:
            ready.send([])
        return 1
    settle_heap()
    ports = [s.port for s in servers]
    events = [w.kv_events for w in workers]
    if ready is not None:
        ready.send([
            (port, None if e is None else (e.endpoint, e.replay_endpoint))
            for port, e in zip(ports, events, strict=True)
        ])  # fmt: skip
    if announce:
        for spec, port, e in zip(specs, ports, events, strict=True):
            said = f"sim worker {spec.model} ({spec.profile}) on http://{host}:{port}"
            if e is not None:
                said += f", KV events on {e.endpoint} (replay {e.replay_endpoint})"
            print(said, flush=True)
    stop = asyncio.Event()
    for sig in stop_signals:
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for worker, server in zip(workers, servers, strict=True):
        server.abort()
        await worker.stop()
    return 0


def _child(specs: list[SimSpec], host: str, ready: multiprocessing.connection.Connection) -> None:
    import uvloop

    # Ctrl-C in the terminal reaches the whole process group; the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    uvloop.run(serve_specs(specs, host, ready=ready, stop_signals=(signal.SIGTERM,)))


class SimFleetProcess:
    """The built-in fleet in a child process of its own."""

    def __init__(self, specs: list[SimSpec], host: str = "127.0.0.1") -> None:
        self._specs = specs
        self._host = host
        self._process: multiprocessing.process.BaseProcess | None = None
        self.kv_endpoints: list[tuple[str, str] | None] = []
        self.urls: list[str] = []
        """Per spec, once started: its KV events' (endpoint, replay endpoint), or None."""

    def start(self, timeout_s: float = 30.0) -> list[str]:
        """Start the process; return each spec's URL once all are listening (blocking)."""
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=_child, args=(self._specs, self._host, child), name="fleetgate-sims", daemon=True
        )
        self._process.start()
        child.close()
        if not parent.poll(timeout_s):
            self.stop()
            raise RuntimeError("the built-in sim workers did not start in time")
        try:
            started: list[tuple[int, tuple[str, str] | None]] = parent.recv()
        except EOFError:
            started = []
        if len(started) != len(self._specs):
            self.stop()
            raise RuntimeError("the built-in sim workers could not listen")
        self.kv_endpoints = [events for _, events in started]
        self.urls = [f"http://{self._host}:{port}" for port, _ in started]
        return self.urls

    @property
    def places(self) -> list[tuple[str, tuple[str, str] | None]]:
        """Per spec, once started: its URL and KV events' endpoints."""
        return list(zip(self.urls, self.kv_endpoints, strict=True))

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or not process.is_alive():
            return
        process.terminate()
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()
