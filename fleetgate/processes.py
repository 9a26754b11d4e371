"""`fleetgate serve --workers N`: N gateway processes on one port, for more cores than one
event loop uses.

The first process is a supervisor: it resolves the config once (the pools asked of
`--backend` servers, the embedded sim workers started, a free port chosen when the config
says 0), then starts N worker processes that each run the whole gateway and listen on that
port with SO_REUSEPORT, so the kernel spreads new connections over them. It forwards SIGINT
and SIGTERM to them (each drains, as one gateway does; a second signal stops them at once),
starts again a worker that dies unasked (after a second; one that dies at start three times
in a row stops them all, exit status 1), and stops the sims when the last worker has
stopped. A worker whose supervisor is gone drains and stops.

What the workers do not share without `state.url` (Redis) is said at start: each keeps its
own view of the fleet's load, its own admission queue, prefix index, sessions and Responses
pins, its own metrics (a scrape reaches one of them), and the admin API changes the one it
reaches. Rate limits counted in memory would be enforced once per worker, so N workers with
limited tenants need `limits.store: redis`. Without it the Batch API is off too: a batch would
live in the memory of the process that took it, and the next request about it may reach
another. With it, the workers share the batch directory and one at a time runs the batches
(batches/sharing.py).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import socket
import sys
import threading
import time
from multiprocessing.context import SpawnProcess

import msgspec
import uvloop

from fleetgate.clock import Clock, LoopClock
from fleetgate.config import Config, ConfigError
from fleetgate.traffic.tenants import Tenant

RESTART_DELAY_S = 1.0
STARTUP_S = 10.0  # a worker that dies sooner after its start died starting
QUICK_DEATHS = 3  # in a row: it will not start (a port taken, a file it cannot open)
_CONTEXT = multiprocessing.get_context("spawn")  # no loop, socket or thread carried over


def check_workers(config: Config, workers: int) -> None:
    """Refuse what N processes would get wrong: limits counted in each one's memory, sim
    workers each would start for an autoscaled pool."""
    started = [p.model for p in config.pools if p.autoscale.enabled and p.autoscale.local]
    if workers > 1 and started:
        raise ConfigError(
            f"--workers {workers}: the pool {started[0]!r} is autoscaled by starting workers "
            f"here, and each of the {workers} processes would start its own; run one"
        )
    scaled = [p.model for p in config.pools if p.autoscale.enabled and p.autoscale.kubernetes]
    if workers > 1 and scaled and config.state.url is None:
        raise ConfigError(
            f"--workers {workers}: the pool {scaled[0]!r} is autoscaled through Kubernetes, and "
            f"each process would scale it; set state.url so that one at a time does"
        )
    limited = any(Tenant.of(t).limited for t in config.tenants)
    if workers > 1 and limited and config.limits.store != "redis":
        raise ConfigError(
            f"--workers {workers}: tenants have limits, and counted in each worker's memory "
            f"they would be enforced {workers} times over; set limits.store: redis"
        )


def unshared(config: Config, workers: int) -> str | None:
    """What each of the workers keeps to itself, in words (None: one worker)."""
    if workers < 2:
        return None
    alone = "its own metrics (a scrape reaches one worker) and admin API changes"
    if config.state.url is None:
        alone = (
            "its own view of the fleet's load, admission queue, prefix index, sessions, "
            f"Responses pins, {alone} (set state.url to share the load)"
        )
    said = f"fleetgate: {workers} workers on one port; each keeps {alone}"
    if config.batches.enabled and config.state.url is None:
        said += "; the Batch API is off (set state.url, or run one worker, for batches)"
    return said


def _pick_port(host: str) -> socket.socket:
    """A socket bound (not listening) to a free port that the workers may share: held
    until they stop, so that nothing else takes the port meanwhile."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    held = socket.socket(family, socket.SOCK_STREAM)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    held.bind((host, 0))
    return held


async def serve_workers(config: Config, workers: int, clock: Clock | None = None) -> int:
    """The supervisor: run `workers` gateway processes until SIGINT or SIGTERM; its exit
    status (1 when a worker kept dying at start)."""
    clock = clock or LoopClock()
    from fleetgate.running import start_sims

    check_workers(config, workers)
    note = unshared(config, workers)
    if note is not None:
        print(note, file=sys.stderr, flush=True)
    if config.batches.enabled and config.state.url is None:  # each would keep its own
        batches = msgspec.structs.replace(config.batches, enabled=False)
        config = msgspec.structs.replace(config, batches=batches)
    loop = asyncio.get_running_loop()
    sims, config = await loop.run_in_executor(None, start_sims, config, random.Random(config.seed))
    held = None
    if config.server.port == 0:
        held = _pick_port(config.server.host)
        server = msgspec.structs.replace(config.server, port=held.getsockname()[1])
        config = msgspec.structs.replace(config, server=server)
    signals = asyncio.Queue[int]()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    loop.add_signal_handler(signal.SIGHUP, _no_reload)
    procs = [_start(config, index) for index in range(workers)]
    try:
        return await _supervise(config, procs, signals, clock)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
        if held is not None:
            held.close()
        if sims is not None:
            sims.stop()


async def _supervise(
    config: Config, procs: list[SpawnProcess], signals: asyncio.Queue[int], clock: Clock
) -> int:
    """Until a signal has stopped every worker (0), or one keeps dying at start (1)."""
    started = [clock.now()] * len(procs)
    quick = [0] * len(procs)  # deaths in a row within STARTUP_S of a start
    stopping, code = False, 0
    while True:
        try:
            sig: int | None = await clock.within(signals.get(), 0.2)
        except TimeoutError:
            sig = None
        if sig is not None:
            stopping = True
            _signal(procs, signal.SIGTERM)
        if stopping:
            if not any(proc.is_alive() for proc in procs):
                return code
            continue
        for index, proc in enumerate(procs):
            if proc.is_alive():
                continue
            now = clock.now()
            quick[index] = quick[index] + 1 if now - started[index] < STARTUP_S else 0
            if quick[index] >= QUICK_DEATHS:
                print(f"fleetgate: worker {index} keeps exiting at start (exit code "
                      f"{proc.exitcode}); stopping", file=sys.stderr, flush=True)  # fmt: skip
                stopping, code = True, 1
                _signal(procs, signal.SIGTERM)
                break
            print(f"fleetgate: worker {index} exited ({proc.exitcode}); starting it again",
                  file=sys.stderr, flush=True)  # fmt: skip
            await clock.sleep(RESTART_DELAY_S)
            procs[index] = _start(config, index)
            started[index] = clock.now()


def _no_reload() -> None:
    print(
        "fleetgate: SIGHUP ignored: with --workers the config is not reloaded; restart",
        file=sys.stderr, flush=True,
    )  # fmt: skip


def _signal(procs: list[SpawnProcess], sig: int) -> None:
    for proc in procs:
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, sig)


def _start(config: Config, index: int) -> SpawnProcess:
    proc = _CONTEXT.Process(target=_worker, args=(config, index), name=f"fleetgate-{index}")
    proc.start()
    return proc


def _worker(config: Config, index: int) -> None:
    """One worker process: the whole gateway on the shared port."""
    from fleetgate.running import serve_forever

    os.setpgrp()  # a terminal's Ctrl-C reaches the supervisor alone, which passes it on
    parent = os.getppid()

    def orphaned() -> None:  # the supervisor died without a word: drain and stop
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=orphaned, name="supervisor-watch", daemon=True).start()
    uvloop.run(serve_forever(config, worker=index))
