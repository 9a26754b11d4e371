"""The local actuator: a pool's replicas are `fleetgate worker sim` processes on this machine,
started and stopped by the gateway (a demo, the tests, benchmarks/autoscale.py).

A started worker listens on a free port of `host`; once it accepts connections it joins the
pool as discovery's backends do (fleet/membership.py `add`, probe first): it takes nothing
until a health probe passes, then ramps up over the pool's slow start. A worker is stopped
only once the scaler has drained it and it has left the pool (autoscale/scaler.py): none of
its requests is cut. The actuator stops every worker it started when it is closed.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Sequence

from fleetgate.fleet.backend import backend_id
from fleetgate.fleet.membership import Joining, Membership
from fleetgate.settings import Settings, positive_seconds

STOP_GRACE_S = 5.0  # a stopped worker's time to exit on SIGTERM before SIGKILL


class LocalActuatorSettings(Settings, frozen=True):
    """`pools[].autoscale.local`: the sim workers this gateway starts for the pool."""

    profile: str = "h100-llama3-8b"  # the engine profile each runs (fleetgate worker sim)
    host: str = "127.0.0.1"
    labels: dict[str, str] = {}  # each one's labels (region, zone, ...)
    args: list[str] = []  # more `fleetgate worker sim` flags, e.g. ["--added-latency", "0.02"]
    start_timeout_s: float = 30.0  # a worker not listening by then is stopped, and not counted

    def __post_init__(self) -> None:
        positive_seconds("start_timeout_s", self.start_timeout_s)
        if any(not a.startswith("--") and not _plain(a) for a in self.args):
            raise ValueError("`args`: give flags and plain values only")
        for flag in ("--host", "--port", "--model", "--replicas", "--profile"):
            if flag in self.args:
                raise ValueError(f"`args`: {flag} is the actuator's to set")


def _plain(value: str) -> bool:
    return all(c.isalnum() or c in "._-:/" for c in value)


class LocalActuator:
    """Starts and stops the sim workers of the pool of `model`."""

    name = "local"

    def __init__(
        self,
        model: str,
        settings: LocalActuatorSettings,
        members: Membership,
    ) -> None:
        self._model = model
        self._settings = settings
        self._members = members
        self._workers: dict[str, asyncio.subprocess.Process] = {}  # by backend id

    def owns(self, backend: str) -> bool:
        return backend in self._workers

    async def start(self, count: int, desired: int) -> int:
        """Start `count` workers (the pool's replicas are all its members: `desired` is met
        by them); each joins the pool once it listens. How many did."""
        started = await asyncio.gather(*(self._start_one() for _ in range(count)))
        return sum(started)

    async def _start_one(self) -> bool:
        s = self._settings
        port = _free_port(s.host)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fleetgate", "worker", "sim", "--host", s.host,
            "--port", str(port), "--model", self._model, "--profile", s.profile, *s.args,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://{s.host}:{port}"
        try:
            listening = await self._listening(s.host, port, process)
        except BaseException:  # cancelled (a reload, the gateway stopping): it is no one's
            process.kill()
            raise
        if not listening:
            await _stop(process)
            return False
        self._workers[backend_id(url)] = process
        self._members.add(self._model, Joining(url, labels=s.labels), probe_first=True)
        return True

    async def _listening(self, host: str, port: int, process: asyncio.subprocess.Process) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.start_timeout_s
        while loop.time() < deadline and process.returncode is None:
            try:
                _, writer = await asyncio.open_connection(host, port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            return True
        return False

    async def stop(self, backends: Sequence[str]) -> None:
        """Stop these workers (drained, out of the pool)."""
        await asyncio.gather(*(_stop(self._workers.pop(b)) for b in backends if self.owns(b)))

    def close(self) -> None:
        """Stop every worker it started, at once (the gateway stops, or autoscaling ends)."""
        for process in self._workers.values():
            if process.returncode is None:
                process.kill()
        self._workers.clear()


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), STOP_GRACE_S)
    except TimeoutError:
        process.kill()
        await process.wait()


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
