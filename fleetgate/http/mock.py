"""A transport that answers from a script instead of the network, for tests of what runs
above the transport (retries, hedging, continuation) without sockets: httpx's MockTransport,
for fleetgate's `Transport` (http/transport.py).

    transport = MockTransport(lambda sent: Script(200, chunks=[b"data: ...\\n\\n"]))

The handler sees each request as sent and returns the `Script` of its answer: a status and
headers after `head_delay_s`, then the body's chunks (each after `chunk_delay_s`), then the
end, or `error` raised in place of the head (`at_chunk=None`) or after that many chunks.

Time passes on the injected clock (on a virtual-time loop, a script's delays take no real
time), and the request's deadlines are kept as the HTTP client keeps them: a head later than
`timeout_s`, a body past `expire_in`'s total, or silent for longer than its idle time, fail at
that deadline with the client's `UpstreamTimeout` (same phase, same message).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fleetgate.clock import Clock, LoopClock
from fleetgate.http.client import Origin
from fleetgate.http.errors import UpstreamError, UpstreamTimeout
from fleetgate.http.response import RelaySink


@dataclass(frozen=True, slots=True)
class Sent:
    """A request as the transport was asked to send it."""

    origin: Origin
    method: bytes
    path: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass(frozen=True, slots=True)
class Script:
    """How a mock upstream answers one request."""

    status: int = 200
    chunks: Sequence[bytes] = ()
    headers: Sequence[tuple[bytes, bytes]] = ()
    head_delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    error: UpstreamError | None = None
    at_chunk: int | None = None  # None: the error comes instead of the head
    hang: bool = False  # after the chunks, never end (until cancelled or timed out)


class MockAnswer:
    """An answer played from its script."""

    def __init__(self, script: Script, clock: Clock) -> None:
        self._script = script
        self._clock = clock
        self.status = script.status
        self.headers = list(script.headers)
        self.expiry: tuple[float, float | None] | None = None  # (total, idle) as last set
        self._total_at = math.inf  # when the body must have ended (`expire_in`)
        self._total_error: UpstreamTimeout | None = None
        self._idle_error: UpstreamTimeout | None = None
        self.paused = False
        self.closed = False

    def header(self, name: bytes) -> bytes | None:
        for key, value in self._script.headers:
            if key == name:
                return value
        return None

    async def _play(self, each: Callable[[bytes], None]) -> None:
        script = self._script
        for i, chunk in enumerate(script.chunks):
            if script.error is not None and script.at_chunk == i:
                raise script.error
            if script.chunk_delay_s:
                await self._silence(script.chunk_delay_s)
            each(chunk)
        if script.error is not None and script.at_chunk is not None:
            raise script.error
        if script.hang:
            await self._silence(math.inf)

    async def _silence(self, seconds: float) -> None:
        """The upstream sends nothing for `seconds` (inf: ever), unless a deadline of the
        body's comes first: then its UpstreamTimeout, at that deadline."""
        clock = self._clock
        left, error = self._total_at - clock.now(), self._total_error
        idle = self.expiry[1] if self.expiry is not None else None
        if idle is not None and not self.paused and idle < left:  # paused: no idle timer
            left, error = idle, self._idle_error
        if seconds <= left:
            if math.isinf(seconds):
                await asyncio.Event().wait()  # never set: until cancelled
            else:
                await clock.sleep(seconds)
            return
        await clock.sleep(max(0.0, left))
        assert error is not None
        raise error

    async def read(self) -> bytes:
        parts: list[bytes] = []
        await self._play(parts.append)
        return b"".join(parts)

    async def relay(self, sink: RelaySink) -> None:
        def each(chunk: bytes) -> None:
            sink.pending.append(chunk)
            sink.flush()

        await self._play(each)

    def expire_in(
        self, delay_s: float, message: str, idle_s: float | None = None, idle_message: str = ""
    ) -> None:
        self.expiry = (delay_s, idle_s)
        self._total_at = self._clock.now() + delay_s
        self._total_error = UpstreamTimeout(message, "total")
        self._idle_error = UpstreamTimeout(idle_message, "idle")

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


@dataclass(slots=True)
class MockTransport:
    """Answers every request with `handler(sent)` on `clock`; keeps what was sent in `sent`."""

    handler: Callable[[Sent], Script]
    clock: Clock = field(default_factory=LoopClock)
    sent: list[Sent] = field(default_factory=list)

    async def request(
        self,
        origin: Origin,
        method: bytes,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes = b"",
        *,
        timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
    ) -> MockAnswer:
        sent = Sent(origin, method, path, list(headers), body)
        self.sent.append(sent)
        script = self.handler(sent)
        if script.head_delay_s:
            if timeout_s is not None and script.head_delay_s > timeout_s:
                await self.clock.sleep(timeout_s)
                message = f"no answer within {timeout_s:g} s (the first-byte timeout)"
                raise UpstreamTimeout(message, "head")
            await self.clock.sleep(script.head_delay_s)
        if script.error is not None and script.at_chunk is None:
            raise script.error
        return MockAnswer(script, self.clock)
