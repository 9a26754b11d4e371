"""A protocol-level HTTP/1.1 server on uvloop and httptools: the one server stack of fleetgate.

Measured as the fastest sound option for an LLM proxy in Python (docs/benchmarks.md, "Why this HTTP
stack"): no ASGI layer, no per-request framework objects beyond `Request` and `ResponseWriter`.
Each connection handles its requests in order (pipelined requests wait their turn); a handler is
one task, cancelled when the client goes away, which is how a disconnect reaches the upstream.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import httptools

from fleetgate.clock import Clock, LoopClock
from fleetgate.http.deadlines import NEVER, DeadlineSweeper
from fleetgate.http.limits import BodyBudget, ServerLimits
from fleetgate.http.writer import ClientDisconnected, ResponseWriter

__all__ = ["HttpConnection", "HttpServer", "Request", "ServerLimits", "start_server"]

log = logging.getLogger(__name__)


class Request:
    """One parsed HTTP request: the body is read in full before the handler runs."""

    __slots__ = (
        "body", "body_too_large", "headers", "held", "http11", "keep_alive", "method", "path",
        "query",
    )  # fmt: skip

    def __init__(
        self,
        method: bytes,
        path: bytes,
        query: bytes,
        headers: dict[bytes, bytes],
        body: bytes,
        keep_alive: bool,
        body_too_large: bool,
        http11: bool = True,
        held: int = 0,
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers  # lower-case names; a repeated header keeps its last value
        self.body = body
        self.keep_alive = keep_alive
        self.body_too_large = body_too_large
        self.http11 = http11  # False: an HTTP/1.0 client, which cannot read chunked framing
        self.held = held  # bytes of the server's body budget this request holds until answered


class _BadHttp(Exception):
    """Raised in a parser callback to stop at a head that gets an error at once."""

    def __init__(self, status: int, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry = retry  # a 503 for a full server: the client may come back


class _Discard:
    """Callbacks of a parser that nothing feeds any more."""


# What a closed connection holds in place of its parser (see `connection_lost`).
_SPENT = httptools.HttpRequestParser(_Discard())

Handler = Callable[[Request, ResponseWriter], Awaitable[None]]
_RETRY_AFTER = ((b"retry-after", b"1"),)
_HEAD_TOO_LARGE = "the request line and headers are too large; send fewer"
_BODY_TOO_LARGE = "The request body is larger than this gateway accepts; send a smaller one."
_BODIES_FULL = "The gateway holds too many request bodies right now; retry shortly."
_NONE: tuple[tuple[bytes, bytes], ...] = ()


class ErrorResponder(Protocol):
    """Sends the server's own error answers (the gateway's are OpenAI-shaped)."""

    def __call__(
        self,
        writer: ResponseWriter,
        status: int,
        message: str,
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None: ...


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests and runs the handler for each, in order."""

    def __init__(
        self,
        handler: Handler,
        on_error: ErrorResponder,
        limits: ServerLimits,
        live: set[HttpConnection],
        loop: asyncio.AbstractEventLoop,
        bodies: BodyBudget,
        now: Callable[[], float],
    ) -> None:
        # Kept, not looked up: asyncio.get_running_loop() costs a getpid() syscall on 3.11.
        self._loop = loop
        self._now = now  # the server's clock, which its sweeper reads too
        self._handler = handler
        self._live = live
        self._on_error = on_error
        self._limits = limits
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._body_size = 0
        self._bodies = bodies
        self._held = 0  # of `bodies`, by the body being received
        self._busy = False  # the body being received is discarded: no room in `bodies`
        self._head_bytes = 0
        self._in_head = False
        self._deferred_error: _BadHttp | None = None  # sent after the queued answers
        self._too_large = False
        self.deadline = NEVER  # clock time of the idle or request-read deadline (deadlines.py)
        self._deadline_message: str | None = None  # None: idle, close quietly; else a 408
        self._pending: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._drained_callbacks: list[Callable[[], None]] = []
        self.paused = False
        self.closed = False

    def serve_with(self, handler: Handler, on_error: ErrorResponder) -> None:
        """The handler of the requests that start from now on (the server's `serve_with`)."""
        self._handler, self._on_error = handler, on_error

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        if len(self._live) >= self._limits.max_connections:
            # Answered before any request: a client that reads gets why, then the close.
            message = "The gateway has too many open connections; retry shortly."
            self._on_error(ResponseWriter(self, keep_alive=False), 503, message, _RETRY_AFTER)
            self._close()
            return
        self._live.add(self)
        self._transport.set_write_buffer_limits(high=self._limits.write_high_water)
        self._arm(self._limits.keep_alive_timeout_s, None)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(
                _BadHttp(400, "upgrades (HTTP/2 included) are not supported; use HTTP/1.1")
            )
            return
        except httptools.HttpParserCallbackError as exc:
            refused = exc.__context__
            if isinstance(refused, _BadHttp):
                self._reject(refused)
            else:
                self._reject(_BadHttp(400, "the request is not valid HTTP/1.1"))
            return
        except httptools.HttpParserError:
            self._reject(_BadHttp(400, "the request is not valid HTTP/1.1"))
            return
        if self._in_head:
            # Still inside a request's head after all of `data`: count it here, because the
            # parser buffers a long header line without calling back until it ends.
            self._head_bytes += len(data)
            if self._head_bytes > self._limits.max_header_bytes:
                self._reject(_BadHttp(431, _HEAD_TOO_LARGE))

    def eof_received(self) -> bool:
        # A client's EOF is a disconnect, as nginx treats it: what it asked for is cancelled
        # (streams stop upstream). Half-closing clients that still wait are not supported.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._live.discard(self)
        for request in self._pending:
            self._release(request)
        self._pending.clear()
        self._bodies.give(self._held)  # of a body cut off mid-way
        self._held = 0
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None  # the loop holds it while it runs; a task cancelled early would
        # hold, in its CancelledError's traceback, the frame that holds this connection
        self._wake_drain()
        # The parser holds this connection and this connection the parser: a cycle that only
        # the collector would free, and the gateway runs it rarely (runtime.py), so a closed
        # connection would keep its last body for good. Break it now; no callback comes after
        # connection_lost.
        self._parser = _SPENT
        self._body = []
        self._headers = {}

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_drain()

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []
        self._body_size = 0
        self._head_bytes = 0
        self._in_head = True
        self._too_large = False
        self._busy = False
        if self._task is None:  # a pipelined request waits its turn without a deadline
            self._arm(self._limits.request_timeout_s, "the request took too long to arrive")

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self._in_head = False
        headers = self._headers
        size = len(self._url) + sum(len(k) + len(v) + 4 for k, v in headers.items())
        if size > self._limits.max_header_bytes:
            raise _BadHttp(431, _HEAD_TOO_LARGE)  # the parser stops; data_received answers
        if b"host" not in headers and self._parser.get_http_version() == "1.1":
            raise _BadHttp(400, "an HTTP/1.1 request must have a Host header (RFC 9112 3.2)")
        length = headers.get(b"content-length")
        if length is not None:  # a digit string: the parser has refused anything else
            declared = int(length)
            if declared > self._limits.max_body_bytes:
                self._too_large = True
            elif declared and not self._hold(declared):
                self._busy = True
        if headers.get(b"expect") == b"100-continue":
            # The client waits for a word before it sends the body: refuse it now, and it
            # never sends the body at all.
            if self._too_large:
                raise _BadHttp(413, _BODY_TOO_LARGE)
            if self._busy:
                raise _BadHttp(503, _BODIES_FULL, retry=True)
            if self._task is None:
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits a second without it

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._too_large or self._busy:
            return  # discarded as it arrives
        if self._body_size > self._limits.max_body_bytes:
            self._too_large = True
            self._drop_body()
        elif self._body_size > self._held and not self._hold(self._body_size - self._held):
            self._busy = True  # a chunked body that has outgrown the room left
            self._drop_body()
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if self._parser.should_upgrade():
            return  # feed_data raises HttpParserUpgrade next; the client gets a 400
        if self._busy:
            self._disarm()
            self._reject(_BadHttp(503, _BODIES_FULL, retry=True))
            return
        path, _, query = self._url.partition(b"?")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        parser = self._parser
        request = Request(
            method=parser.get_method(),
            path=path,
            query=query,
            headers=self._headers,
            body=body,
            keep_alive=parser.should_keep_alive(),
            body_too_large=self._too_large,
            http11=parser.get_http_version() != "1.0",
            held=self._held,
        )
        self._held = 0  # the request holds it now, until answered
        self._body = []
        self._disarm()
        if self._task is None:
            self._start(request)
        else:
            # Pipelined: hold this one and read no further until its turn, so one connection
            # never buffers more than a read's worth of requests.
            self._pending.append(request)
            if self._transport is not None:
                self._transport.pause_reading()

    # -- internals --------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if not self.closed and self._transport is not None:
            self._transport.write(data)

    def writelines(self, parts: tuple[bytes, bytes]) -> None:
        if not self.closed and self._transport is not None:
            self._transport.writelines(parts)

    async def drain(self) -> None:
        if self.closed:
            raise ClientDisconnected
        if not self.paused:
            return
        waiter = self._loop.create_future()
        self._drain_waiter = waiter
        await waiter
        if self.closed:
            raise ClientDisconnected

    @property
    def idle(self) -> bool:
        return self._task is None

    def when_drained(self, callback: Callable[[], None]) -> None:
        if self.paused and not self.closed:
            self._drained_callbacks.append(callback)
        else:
            callback()

    def _wake_drain(self) -> None:
        callbacks, self._drained_callbacks = self._drained_callbacks, []
        for callback in callbacks:
            callback()
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _hold(self, n: int) -> bool:
        """Count `n` more bytes of the body being received in the server's budget."""
        if self._bodies.take(n):
            self._held += n
            return True
        return False

    def _drop_body(self) -> None:
        self._body.clear()
        self._bodies.give(self._held)
        self._held = 0

    def _release(self, request: Request) -> None:
        self._bodies.give(request.held)
        request.held = 0

    def _start(self, request: Request) -> None:
        self._task = self._loop.create_task(self._run(request))

    async def _run(self, request: Request) -> None:
        writer = ResponseWriter(
            self, request.keep_alive, request.method == b"HEAD", chunked=request.http11
        )
        try:
            await self._handler(request, writer)
        except (asyncio.CancelledError, ClientDisconnected):
            self._close()
            return
        except Exception:
            log.exception("handler failed for %s %s", request.method, request.path)
            if not writer.started:
                closing = ResponseWriter(self, keep_alive=False)
                self._on_error(closing, 500, "the gateway failed to handle this request")
            self._close()
            return
        finally:
            self._release(request)
        if not writer.finished:  # a handler that returns mid-stream leaves it unusable
            self._close()
            return
        self._task = None
        if not writer.keep_alive:  # the request's wish, or a stream only the close ends
            self._close()
        elif self._pending:
            self._start(self._pending.popleft())
            if not self._pending and self._transport is not None and not self.closed:
                self._transport.resume_reading()
        elif self._deferred_error is not None:
            self._reject(self._deferred_error)
        else:
            self._arm(self._limits.keep_alive_timeout_s, None)

    def _arm(self, delay_s: float, timeout_message: str | None) -> None:
        """(Re)set the connection's one deadline: idle (close quietly) or reading (408)."""
        self.deadline = self._now() + delay_s
        self._deadline_message = timeout_message

    def _disarm(self) -> None:
        self.deadline = NEVER

    def expire(self) -> None:
        """Called by the server's sweeper once `deadline` has passed."""
        self.deadline = NEVER
        message = self._deadline_message
        if self._task is not None:
            return  # never cut a response in progress
        if message is not None:
            self._reject(_BadHttp(408, message))
        elif self._transport is not None and self._transport.get_write_buffer_size():
            self.abort()  # idle, yet the client never read what it was sent: let it go now
        else:
            self._close()

    def _reject(self, refused: _BadHttp) -> None:
        if self._task is not None:
            # Answer the requests that came before the bad bytes first, then this.
            self._deferred_error = refused
            if self._transport is not None:
                self._transport.pause_reading()
            return
        if self._transport is not None and not self.closed:
            headers = _RETRY_AFTER if refused.retry else _NONE
            writer = ResponseWriter(self, keep_alive=False)
            self._on_error(writer, refused.status, refused.message, headers)
        self._close()

    def _close(self) -> None:
        if self._transport is not None and not self.closed:
            self.closed = True
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self.closed = True
            self._transport.abort()


@dataclass(slots=True)
class _Serving:
    """What a server's connections run: a new connection takes the handler of the moment."""

    handler: Handler
    on_error: ErrorResponder


class HttpServer:
    """A listening server, its open connections, and the sweeper of their deadlines."""

    def __init__(
        self,
        server: asyncio.Server,
        live: set[HttpConnection],
        sweeper: DeadlineSweeper[HttpConnection],
        clock: Clock,
        serving: _Serving,
    ) -> None:
        self.server = server
        self._live = live
        self._sweeper = sweeper
        self._clock = clock
        self._serving = serving

    def serve_with(self, handler: Handler, on_error: ErrorResponder) -> None:
        """Hand every request from now on to `handler` (a reloaded config's), on open
        connections too; a request running goes on with the handler it began with."""
        self._serving.handler, self._serving.on_error = handler, on_error
        for conn in self._live:
            conn.serve_with(handler, on_error)

    @property
    def port(self) -> int:
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        """Stop listening; let idle keep-alive connections go."""
        self._sweeper.stop()
        self.server.close()
        for conn in list(self._live):
            if conn.idle:
                conn.abort()
        await self.server.wait_closed()

    async def drain(self, timeout_s: float) -> int:
        """Stop listening and let the requests in progress finish, for up to `timeout_s`;
        then cut what is left. Returns how many requests were still running at the end."""
        self.server.close()
        clock = self._clock
        deadline = clock.now() + timeout_s
        while True:
            for conn in list(self._live):
                if conn.idle:
                    conn.abort()  # between requests: nothing is lost by closing it
            if not self._live or clock.now() >= deadline:
                break
            await clock.sleep(0.05)
        left = len(self._live)
        self.abort()
        return left

    def abort(self) -> None:
        """Stop listening and cut every connection, as a crash would."""
        self._sweeper.stop()
        self.server.close()
        for conn in list(self._live):
            conn.abort()


async def start_server(
    handler: Handler,
    on_error: ErrorResponder,
    host: str,
    port: int,
    limits: ServerLimits | None = None,
    tls: ssl.SSLContext | None = None,
    clock: Clock | None = None,
    reuse_port: bool = False,
) -> HttpServer:
    """Listen on host:port (TLS with `tls`) and serve every connection with `handler`; its
    timeouts run on `clock` (the running loop's by default). With `reuse_port`, other
    processes may listen on the same port, and the kernel spreads connections over them
    (SO_REUSEPORT: `serve --workers`)."""
    lim = limits or ServerLimits()
    clock = clock or LoopClock()
    live: set[HttpConnection] = set()
    bodies = BodyBudget(lim.max_buffered_body_bytes)
    loop = asyncio.get_running_loop()
    now = clock.now
    serving = _Serving(handler, on_error)
    server = await loop.create_server(
        lambda: HttpConnection(serving.handler, serving.on_error, lim, live, loop, bodies, now=now),
        host, port, backlog=4096, ssl=tls, reuse_port=reuse_port or None,
    )  # fmt: skip
    sweeper = DeadlineSweeper(clock, live)
    sweeper.start()
    return HttpServer(server, live, sweeper, clock, serving)
