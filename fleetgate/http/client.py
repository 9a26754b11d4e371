"""A pooled HTTP/1.1 client on uvloop and httptools: how fleetgate talks to every upstream.

Connections to each origin are kept alive and reused (last used first, so the warmest socket
serves). A response's body is delivered chunk by chunk as it arrives, which is what lets the
gateway relay a stream without buffering it; a consumer that stops reading pauses the socket.

Errors raised (all `UpstreamError`, translated here once from the socket and parser errors):
    UpstreamError
     +-- ConnectError   the connection could not be opened (refused, unreachable, timed out)
     +-- ReadError      the connection closed or reset before the response ended
     +-- ProtocolError  the upstream sent something that is not HTTP/1.1
     +-- UpstreamTimeout  no answer head, or no end of the answer, in the time given
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

from fleetgate.http.deadlines import NEVER, DeadlineSweeper


class UpstreamError(Exception):
    """Talking to an upstream failed."""


class ConnectError(UpstreamError):
    """The connection could not be opened."""


class ReadError(UpstreamError):
    """The connection ended before the whole response arrived."""


class ProtocolError(UpstreamError):
    """The upstream's bytes are not a valid HTTP/1.1 response."""


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer, or finish answering, in the time it was given."""


class RelaySink(Protocol):
    """Where `UpstreamResponse.relay` hands a body, from the socket's own callback."""

    def chunk(self, data: bytes) -> None:
        """One piece of the body."""

    def flush(self) -> None:
        """The end of one read from the socket: pass on what `chunk` was given, in one go."""


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


_READ_HIGH_WATER = 1024 * 1024  # pause the socket when this much body is unread


class UpstreamResponse:
    """A response whose headers have arrived; its body arrives through `chunks()` or `read()`."""

    __slots__ = (
        "_buffered", "_chunks", "_conn", "_done", "_error", "_sink", "_waiter", "headers",
        "status",
    )  # fmt: skip

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._done = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: RelaySink | None = None

    def header(self, name: bytes) -> bytes | None:
        """The value of a header (lower-case name), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def read(self) -> bytes:
        """The whole body."""
        parts = [chunk async for chunk in self.chunks()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def chunks(self) -> UpstreamResponse:
        return self

    def __aiter__(self) -> UpstreamResponse:
        return self

    async def __anext__(self) -> bytes:
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._buffered < _READ_HIGH_WATER:
                    self.resume_reading()
                return chunk
            if self._error is not None:
                raise self._error
            if self._done:
                raise StopAsyncIteration
            await self._wait()

    async def _wait(self) -> None:
        """Until the connection feeds, finishes or fails this response; cancelling aborts it."""
        waiter = self._conn.loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        except asyncio.CancelledError:
            self.close()
            raise

    async def relay(self, sink: RelaySink) -> None:
        """Hand every body chunk to `sink` as it arrives, from the socket's own callback (no task
        switch per chunk), with a flush after each read; return when the body has ended, raise
        `UpstreamError` if it broke.

        The fastest way to pass a stream on: when one read brings several chunks (a busy
        gateway), the sink can pass them on in one write. A sink that cannot keep up calls
        `pause_reading()` and later `resume_reading()`.
        """
        if self._chunks:
            while self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                sink.chunk(chunk)
            sink.flush()
        self._sink = sink
        try:
            while not self._done and self._error is None:
                await self._wait()
        finally:
            self._sink = None
        if self._error is not None:
            raise self._error

    def pause_reading(self) -> None:
        if not self._done and self._error is None:  # once done, the connection is not ours
            self._conn.pause_reading()

    def resume_reading(self) -> None:
        if not self._done and self._error is None:
            self._conn.resume_reading()

    def expire_in(
        self, delay_s: float, message: str, idle_s: float | None = None, idle_message: str = ""
    ) -> None:
        """Fail with `UpstreamTimeout(message)` and abort unless the body ends within delay_s,
        or with `UpstreamTimeout(idle_message)` if `idle_s` pass without a byte of it (time
        spent paused because the gateway's own client is slow does not count)."""
        if not self._done and self._error is None:
            self._conn.set_body_deadlines(delay_s, message, idle_s, idle_message)

    def close(self) -> None:
        """Stop reading; an unfinished response aborts its connection (that cancels upstream)."""
        if not self._done and self._error is None:
            self._fail(ReadError("response abandoned by the gateway"))
            self._conn.abort()

    # -- fed by the connection --------------------------------------------------------------

    def _feed(self, chunk: bytes) -> None:
        if self._sink is not None:
            self._sink.chunk(chunk)
            return
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered >= _READ_HIGH_WATER:
            self._conn.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if not self._done and self._error is None:  # the first cause is the one to report
            self._error = error
            self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an origin; carries one request at a time."""

    def __init__(
        self,
        pool: list[_Connection],
        max_idle: int,
        loop: asyncio.AbstractEventLoop,
        busy: set[_Connection],
    ) -> None:
        # Kept, not looked up: asyncio.get_running_loop() costs a getpid() syscall on 3.11.
        self.loop = loop
        self._pool = pool
        self._max_idle = max_idle
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._response: UpstreamResponse | None = None
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._busy = busy  # connections carrying a request: the client's sweeper checks them
        self.deadline = NEVER  # loop time by which the head (or the body) must have come
        self._deadline_message = ""
        self._total_at = NEVER  # the whole answer's deadline, when an idle one is also set
        self._idle_s: float | None = None  # longest silence allowed inside a body
        self._idle_message = ""
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
        error = ReadError(f"upstream closed the connection: {exc or 'EOF'}")
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        if self._response is not None:
            self._response._fail(error)
            self._response = None

    def data_received(self, data: bytes) -> None:
        self.received = True
        response = self._response
        try:
            self._parser.feed_data(data)
            if response is not None and response._sink is not None:
                response._sink.flush()
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
        if self._response is not None:
            self._response._feed(body)

    def on_message_complete(self) -> None:
        if 100 <= self._parser.get_status_code() < 200:
            return  # an interim response: keep waiting for the final one
        response, self._response = self._response, None
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
            message = f"no answer within {timeout_s:g} s (the first-byte timeout)"
            self.set_deadline(timeout_s, message)
        self._transport.write(data)
        return head

    def set_deadline(self, delay_s: float, message: str) -> None:
        self.deadline = self.loop.time() + delay_s
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
            self.deadline = min(self._total_at, self.loop.time() + self._idle_s)

    def expire(self) -> None:
        """Called by the client's sweeper once `deadline` has passed."""
        idle = self._idle_s is not None and self.deadline < self._total_at
        self.deadline = NEVER
        self._idle_s = None
        error = UpstreamTimeout(self._idle_message if idle else self._deadline_message)
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
    ) -> None:
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
        conn = await self._connect(origin, pool)
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

    async def _connect(self, origin: Origin, pool: list[_Connection]) -> _Connection:
        loop = asyncio.get_running_loop()
        if self._sweeper is None:
            self._sweeper = DeadlineSweeper(loop, self._busy)
            self._sweeper.start()
        ctx = None
        if origin.scheme == "https":
            if self._ssl_context is None:
                self._ssl_context = ssl.create_default_context()
            ctx = self._ssl_context
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(pool, self._max_idle, loop, self._busy),
                    origin.host,
                    origin.port,
                    ssl=ctx,
                )
        except TimeoutError as exc:
            raise ConnectError(f"connecting to {origin} timed out") from exc
        except OSError as exc:
            raise ConnectError(f"cannot connect to {origin}: {exc.strerror or exc}") from exc
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
