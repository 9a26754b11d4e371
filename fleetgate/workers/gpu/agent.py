"""`fleetgate worker gpu-agent`: runs beside an engine, reads its host's GPUs (workers/gpu/
reader.py) every interval and pushes the readings to the gateway as a heartbeat:

    POST /fleet/heartbeat {"backend": ID, "gpu": [reading, ...]}
    Authorization: Bearer $FLEETGATE_HEARTBEAT_KEY          (when the gateway's auth is on)

The gateway judges them against the pool's `gpu:` thresholds (health/gpu.py). A push that
fails is reported on stderr when the outcome changes (not every interval) and tried again at
the next; the agent never stops for the gateway's sake.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from fleetgate.fleet.gpu import GpuReading
from fleetgate.http.client import HttpClient, Origin
from fleetgate.http.errors import UpstreamError
from fleetgate.workers.gpu.reader import GpuReader

KEY_ENV = "FLEETGATE_HEARTBEAT_KEY"  # the heartbeat key, from the environment (never a flag)
_PATH = b"/fleet/heartbeat"


def _stderr(line: str) -> None:
    print(f"fleetgate gpu-agent: {line}", file=sys.stderr, flush=True)


def _stdout(line: str) -> None:
    print(line, flush=True)


@dataclass(frozen=True, slots=True)
class AgentSettings:
    gateway: str | None = None  # the gateway's base URL; None: only read (and print)
    backend: str | None = None  # the backend's id in the gateway (host:port of its engine)
    key: str | None = None  # the heartbeat key
    interval_s: float = 5.0  # between readings
    once: bool = False  # one reading (and push), then stop
    show: bool = False  # print each round as a JSON line on stdout

    def __post_init__(self) -> None:
        if self.gateway is not None and not self.backend:
            raise ValueError("--gateway needs --backend: the engine's id in the gateway")
        if self.gateway is None and not self.show:
            raise ValueError("give --gateway URL (and --backend ID) to push, or --print")
        if not 0 < self.interval_s < 3600:
            raise ValueError(f"--interval must be in (0, 3600) seconds, got {self.interval_s}")


class GpuAgent:
    """Reads with `reader` and pushes to the gateway with `client`."""

    def __init__(
        self,
        reader: GpuReader,
        settings: AgentSettings,
        client: HttpClient,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        say: Callable[[str], None] = _stderr,
        show: Callable[[str], None] = _stdout,
    ) -> None:
        self._reader = reader
        self._settings = settings
        self._client = client
        self._sleep = sleep
        self._say = say  # what went wrong, or right again
        self._show = show  # the readings, with --print
        self._origin = None if settings.gateway is None else Origin.parse(settings.gateway)
        self._headers = [(b"content-type", b"application/json")]
        if settings.key is not None:
            self._headers.append((b"authorization", b"Bearer " + settings.key.encode()))
        self._last = "ok"  # the last push's outcome, said only when it changes

    async def run(self) -> None:
        """Read and push every interval, until cancelled (or once)."""
        while True:
            await self.round()
            if self._settings.once:
                return
            await self._sleep(self._settings.interval_s)

    async def round(self) -> list[GpuReading]:
        """One reading of every GPU (in a thread: NVML calls block), printed and pushed."""
        readings = await asyncio.to_thread(self._reader.read)
        body = msgspec.json.encode({"backend": self._settings.backend, "gpu": readings})
        if self._settings.show:
            self._show(body.decode())
        if self._origin is not None:
            self._report(await self._push(self._origin, body))
        return readings

    async def _push(self, origin: Origin, body: bytes) -> str:
        """The push's outcome: "ok", or what went wrong."""
        timeout_s = min(self._settings.interval_s, 10.0)
        try:
            response = await self._client.request(
                origin, b"POST", _PATH, self._headers, body, timeout_s=timeout_s
            )
            response.expire_in(timeout_s, "heartbeat timed out")
            answer = await response.read()
        except UpstreamError as exc:
            return f"cannot reach the gateway at {origin}: {exc}"
        if response.status == 200:
            return "ok"
        try:
            message = msgspec.json.decode(answer)["error"]["message"]
        except (msgspec.DecodeError, KeyError, TypeError):
            message = answer[:200].decode(errors="replace")
        return f"the gateway answered {response.status}: {message}"

    def _report(self, outcome: str) -> None:
        if outcome != self._last:
            self._say("pushing readings again" if outcome == "ok" else outcome)
            self._last = outcome


async def run_agent(reader: GpuReader, settings: AgentSettings) -> None:
    """The command's loop: read and push until stopped, then close the reader."""
    client = HttpClient(connect_timeout_s=min(settings.interval_s, 5.0))
    try:
        await GpuAgent(reader, settings, client).run()
    finally:
        await client.close()
        reader.close()
