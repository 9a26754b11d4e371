"""A transport that answers from a script instead of the network, for tests of what runs
above the transport (retries, hedging, continuation) without sockets: httpx's MockTransport,
for fleetgate's `Transport` (http/transport.py).

    transport = MockTransport(lambda sent: Script(200, chunks=[b"data: ...\\n\\n"]))

The handler sees each request as sent and returns the `Script` of its answer: a status and
headers after `head_delay_s`, then the body's chunks (each after `chunk_delay_s`), then the
end, or `error` raised in place of the head (`at_chunk=None`) or after that many chunks.
Waiting uses the injected `sleep`, so a test can run it in virtual time. Deadlines from
`expire_in` are not enforced here: a script that must time out raises `UpstreamTimeout`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

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

    def __init__(self, script: Script, sleep: Callable[[float], Awaitable[None]]) -> None:
        self._script = script
        self._sleep = sleep
        self.status = script.status
        self.headers = list(script.headers)
        self.expiry: tuple[float, float | None] | None = None  # (total, idle) as last set
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
                await self._sleep(script.chunk_delay_s)
            each(chunk)
        if script.error is not None and script.at_chunk is not None:
            raise script.error
        if script.hang:
            await asyncio.Event().wait()

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

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


@dataclass(slots=True)
class MockTransport:
    """Answers every request with `handler(sent)`; keeps what was sent in `sent`."""

    handler: Callable[[Sent], Script]
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
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
                await self.sleep(timeout_s)
                raise UpstreamTimeout(f"no answer within {timeout_s:g} s (the first-byte timeout)")
            await self.sleep(script.head_delay_s)
        if script.error is not None and script.at_chunk is None:
            raise script.error
        return MockAnswer(script, self.sleep)
