"""A pooled HTTP/1.1 client on uvloop and httptools: how fleetgate talks to every upstream.

Connections to each origin are kept alive and reused (last used first, so the warmest socket
serves). A response's body is delivered chunk by chunk as it arrives, which is what lets the
gateway relay a stream without buffering it; a consumer that stops reading pauses the socket.

Errors raised are those of fleetgate/http/errors.py, translated here from socket and parser
errors; responses are fleetgate/http/response.py's.
"""

from __future__ import annotations

import asyncio
import errno
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

import httptools

from fleetgate.clock import Clock, LoopClock
from fleetgate.http.deadlines import NEVER, DeadlineSweeper
from fleetgate.http.errors import (
    ConnectError,
    LocalExhaustion,
    ProtocolError,
    ReadError,
    UpstreamTimeout,
)
from fleetgate.http.response import RelaySink, UpstreamResponse

# Errors opening a socket that say the gateway is out of something, not that the upstream is.
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


def _reason(exc: BaseException | None) -> str:
    """An OS error in words, from its errno alone: the texts asyncio makes carry addresses
    ("Connect call failed ('10.0.0.5', 8000)", "Multiple exceptions: ...")."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno)
    return "EOF" if exc is None else type(exc).__name__


@dataclass(frozen=True, slots=True)
class Origin:
    """scheme://host:port of an upstream, with its Host header rendered once."""

    scheme: str
    host: str
    port: int
    base_path: bytes = b""
    host_header: bytes = field(default=b"", compare=False)

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # IPv6 in brackets
        return cls(parts.scheme, host, port, parts.path.rstrip("/").encode(), netloc.encode())

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host_header.decode()}{self.base_path.decode()}"


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an origin; carries one request at a time."""

    def __init__(
        self,
        pool: list[_Connection],
        max_idle: int,
        loop: asyncio.AbstractEventLoop,
        busy: set[_Connection],
        now: Callable[[], float],
    ) -> None:
        # Kept, not looked up: asyncio.get_running_loop() costs a getpid() syscall on 3.11.
        self.loop = loop
        self._now = now  # the client's clock, which its sweeper reads too
        self._pool = pool
        self._max_idle = max_idle
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._response: UpstreamResponse | None = None
        self.sink: RelaySink | None = None  # set while `UpstreamResponse.relay` runs
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._busy = busy  # connections carrying a request: the client's sweeper checks them
        self.deadline = NEVER  # the clock's time by which the head (or the body) must have come
        self._deadline_message = ""
        self._total_at = NEVER  # the whole answer's deadline, when an idle one is also set
        self._idle_s: float | None = None  # longest silence allowed inside a body
        self._idle_message = ""
        self._first_byte_s = 0.0
        self._reading_paused = False
        self.closed = False
        self.received = False  # any byte of the current request's answer has arrived

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._busy.discard(self)
        if self._response is None and self in self._pool:
            self._pool.remove(self)  # an idle connection the upstream closed
        error = ReadError(f"upstream closed the connection: {_reason(exc)}")
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        if self._response is not None:
            self._response._fail(error)
            self._response = None

    def data_received(self, data: bytes) -> None:
        self.received = True
        sink = self.sink  # taken first: the read may end the response, which clears it
        try:
            self._parser.feed_data(data)
            if sink is not None:
                sink.flush()
            if self._idle_s is not None:
                self._rearm_idle()
        except httptools.HttpParserError as exc:
            error = ProtocolError(f"invalid HTTP from upstream: {exc}")
            if self._head is not None and not self._head.done():
                self._head.set_exception(error)
            if self._response is not None:
                self._response._fail(error)
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost reports an unfinished response

    # -- httptools callbacks ----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._response is not None:
            self._response.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        response = self._response
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            if response is not None:
                response.headers.clear()  # 100 Continue, 103 Early Hints: the answer follows
            return
        self.deadline = NEVER
        if response is not None:
            response.status = status
            head = self._head
            if head is not None and not head.done():
                head.set_result(response)

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        if sink is not None:
            sink.pending.append(body)
        elif self._response is not None:
            self._response._feed(body)

    def on_message_complete(self) -> None:
        if 100 <= self._parser.get_status_code() < 200:
            return  # an interim response: keep waiting for the final one
        response, self._response = self._response, None
        self.sink = None  # the connection may carry another request before the relay returns
        if response is None:
            return
        response._finish()
        self.deadline = NEVER
        self._idle_s = None
        self._busy.discard(self)
        # A reader that fell behind may have paused this socket at the very end; the next
        # request on it must not inherit that.
        self.resume_reading()
        if not self._parser.should_keep_alive():
            self.abort()
        elif not self.closed and len(self._pool) < self._max_idle:
            self._pool.append(self)
        else:
            self.abort()

    # -- used by the client and the response ------------------------------------------------

    def send(self, data: bytes, timeout_s: float | None) -> asyncio.Future[UpstreamResponse]:
        assert self._transport is not None
        self._response = UpstreamResponse(self)
        self.received = False
        head: asyncio.Future[UpstreamResponse] = self.loop.create_future()
        self._head = head
        self._busy.add(self)
        if timeout_s is not None:
            self.set_deadline(timeout_s, "")  # the message is made only if it expires
            self._first_byte_s = timeout_s
        self._transport.write(data)
        return head

    def set_deadline(self, delay_s: float, message: str) -> None:
        self.deadline = self._now() + delay_s
        self._deadline_message = message
        self._idle_s = None

    def set_body_deadlines(
        self, delay_s: float, message: str, idle_s: float | None, idle_message: str
    ) -> None:
        self.set_deadline(delay_s, message)
        self._total_at = self.deadline
        self._idle_s, self._idle_message = idle_s, idle_message
        self._rearm_idle()

    def _rearm_idle(self) -> None:
        if self._idle_s is not None and not self._reading_paused:
            self.deadline = min(self._total_at, self._now() + self._idle_s)

    def expire(self) -> None:
        """Called by the client's sweeper once `deadline` has passed."""
        idle = self._idle_s is not None and self.deadline < self._total_at
        self.deadline = NEVER
        self._idle_s = None
        message = self._idle_message if idle else self._deadline_message
        if idle:
            error = UpstreamTimeout(message, "idle")
        elif message:
            error = UpstreamTimeout(message, "total")
        else:
            message = f"no answer within {self._first_byte_s:g} s (the first-byte timeout)"
            error = UpstreamTimeout(message, "head")
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        if self._response is not None:
            self._response._fail(error)
            self._response = None
        self.abort()

    def pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()
            if self._idle_s is not None:
                self.deadline = self._total_at  # a slow reader is not a silent upstream

    def resume_reading(self) -> None:
        if self._reading_paused and self._transport is not None and not self.closed:
            self._reading_paused = False
            self._transport.resume_reading()
            self._rearm_idle()

    def abort(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.abort()


class HttpClient:
    """Keep-alive connection pools, one per origin."""

    def __init__(
        self,
        *,
        max_idle_per_origin: int = 512,
        connect_timeout_s: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._clock = clock or LoopClock()  # its timeouts
        self._pools: dict[Origin, list[_Connection]] = {}
        self._busy: set[_Connection] = set()
        self._sweeper: DeadlineSweeper[_Connection] | None = None
        self._max_idle = max_idle_per_origin
        self._connect_timeout_s = connect_timeout_s
        self._ssl_context = ssl_context

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
    ) -> UpstreamResponse:
        """Send a request and return once the response's headers have arrived.

        `headers` must not hold host or content-length: they are written here. `timeout_s`
        bounds the wait for the headers once the request is sent (`UpstreamTimeout`).
        """
        parts = [method, b" ", origin.base_path, path, b" HTTP/1.1\r\nhost: ", origin.host_header]
        for name, value in headers:
            parts += (b"\r\n", name, b": ", value)
        if body or method != b"GET":
            parts.append(b"\r\ncontent-length: %d" % len(body))
        parts += (b"\r\n\r\n", body)
        data = b"".join(parts)
        pool = self._pools.get(origin)
        if pool is None:
            pool = self._pools[origin] = []
        if pool:
            conn = pool.pop()
            try:
                return await self._send(conn, data, timeout_s)
            except ReadError:
                # The upstream closed this idle connection just as we reused it (a restart,
                # its idle timeout). If no byte of an answer came, nothing was processed and
                # one fresh connection may carry it; otherwise the failure is the request's.
                if conn.received:
                    raise
        conn = await self._connect(origin, pool, connect_timeout_s or self._connect_timeout_s)
        return await self._send(conn, data, timeout_s)

    async def _send(
        self, conn: _Connection, data: bytes, timeout_s: float | None
    ) -> UpstreamResponse:
        head = conn.send(data, timeout_s)
        try:
            return await head
        except asyncio.CancelledError:
            conn.abort()
            raise

    async def _connect(
        self, origin: Origin, pool: list[_Connection], timeout_s: float
    ) -> _Connection:
        loop = asyncio.get_running_loop()
        if self._sweeper is None:
            self._sweeper = DeadlineSweeper(self._clock, self._busy)
            self._sweeper.start()
        ctx = None
        if origin.scheme == "https":
            if self._ssl_context is None:
                self._ssl_context = ssl.create_default_context()
            ctx = self._ssl_context
        try:
            now = self._clock.now
            _, conn = await self._clock.within(
                loop.create_connection(
                    lambda: _Connection(pool, self._max_idle, loop, self._busy, now),
                    origin.host,
                    origin.port,
                    ssl=ctx,
                ),
                timeout_s,
            )
        except TimeoutError as exc:
            raise ConnectError(f"connecting timed out after {timeout_s:g} s") from exc
        except OSError as exc:
            if exc.errno in _EXHAUSTED:
                raise LocalExhaustion(f"the gateway is out of resources: {_reason(exc)}") from exc
            raise ConnectError(f"cannot connect: {_reason(exc)}") from exc
        return conn

    async def close(self) -> None:
        """Close every idle connection and stop checking deadlines."""
        if self._sweeper is not None:
            self._sweeper.stop()
            self._sweeper = None
        for pool in self._pools.values():
            for conn in pool:
                conn.abort()
            pool.clear()
