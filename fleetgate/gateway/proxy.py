"""The proxy path: pick a backend, forward the body's bytes, relay the answer chunk by chunk."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fleetgate.fleet.pool import Pool
from fleetgate.gateway.errors import error_body, error_event
from fleetgate.http.client import (
    ConnectError,
    HttpClient,
    ProtocolError,
    UpstreamError,
    UpstreamResponse,
    UpstreamTimeout,
)
from fleetgate.http.server import ResponseWriter
from fleetgate.observe.metrics import NO_BACKEND, GatewayMetrics
from fleetgate.routing.base import RoutingRequest

_JSON = b"application/json"
_DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = ((b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"))
# Request headers passed on to the backend; all others stay at the gateway.
_FORWARDED = (b"authorization", b"traceparent", b"tracestate")


def _error_kind(exc: UpstreamError) -> str:
    if isinstance(exc, UpstreamTimeout):
        return "timeout"
    if isinstance(exc, ConnectError):
        return "connect"
    if isinstance(exc, ProtocolError):
        return "protocol"
    return "read"


class Proxy:
    """Forwards one routed request to one backend of its pool."""

    def __init__(
        self, client: HttpClient, metrics: GatewayMetrics, clock: Callable[[], float]
    ) -> None:
        self._client = client
        self._metrics = metrics
        self._clock = clock

    async def forward(
        self,
        pool: Pool,
        routing: RoutingRequest,
        path: bytes,
        headers: dict[bytes, bytes],
        body: bytes,
        request_id: bytes,
        writer: ResponseWriter,
        started: float,
    ) -> None:
        state = pool.pick(routing, started)
        if state is None:
            writer.send(
                503,
                [(b"content-type", _JSON), (b"x-request-id", request_id), (b"retry-after", b"1")],
                error_body(
                    503, f"No healthy backend serves {routing.model!r} right now; retry shortly."
                ),
            )
            self._metrics.request_done(routing.model, NO_BACKEND, 503, self._clock() - started)
            return
        backend = state.backend
        upstream_headers = [(b"content-type", _JSON), (b"x-request-id", request_id)]
        for name in _FORWARDED:
            value = headers.get(name)
            if value is not None:
                upstream_headers.append((name, value))
        pool.begin(state)
        status = 502
        timeouts = pool.timeouts
        # Timeouts are timers on the upstream exchange itself (asyncio.timeout would cost
        # three event-loop lookups, each a getpid() syscall on 3.11, per request).
        deadline = started + timeouts.total_s
        try:
            response = await self._client.request(
                backend.origin, b"POST", path, upstream_headers, body,
                timeout_s=min(timeouts.first_byte_s, deadline - self._clock()),
            )  # fmt: skip
            response.expire_in(
                deadline - self._clock(),
                f"the answer took longer than the pool's total timeout of {timeouts.total_s:g} s",
            )
            status = response.status
            if routing.stream and status == 200:
                writer.start(200, [*_SSE_HEADERS, (b"x-request-id", request_id)])
                await self._relay_stream(routing, response, writer, started)
            else:
                data = await response.read()
                reply = [
                    (b"content-type", response.header(b"content-type") or _JSON),
                    (b"x-request-id", request_id),
                ]
                retry_after = response.header(b"retry-after")  # an engine's backpressure
                if retry_after is not None:
                    reply.append((b"retry-after", retry_after))
                writer.send(status, reply, data)
        except UpstreamError as exc:
            status = self._fail(routing.model, backend.id, exc, writer, request_id)
        except asyncio.CancelledError:
            status = 499  # nginx's "client closed request"
            raise
        finally:
            pool.end(state)
            self._metrics.request_done(routing.model, backend.id, status, self._clock() - started)

    def _fail(
        self,
        model: str,
        backend: str,
        exc: UpstreamError,
        writer: ResponseWriter,
        request_id: bytes,
    ) -> int:
        """Tell the client a backend failed: a JSON error before any byte, else an SSE error
        event that ends the stream (never a silent stop). Returns the status to record."""
        kind = _error_kind(exc)
        self._metrics.upstream_error(model, backend, kind)
        status = 504 if kind == "timeout" else 502
        code = "upstream_timeout" if kind == "timeout" else "upstream_error"
        message = f"Backend {backend} failed: {exc}"
        if not writer.started:
            headers = [(b"content-type", _JSON), (b"x-request-id", request_id)]
            writer.send(status, headers, error_body(status, message, code=code))
        else:
            writer.end(error_event(status, message, code))
        return status

    async def _relay_stream(
        self,
        routing: RoutingRequest,
        response: UpstreamResponse,
        writer: ResponseWriter,
        started: float,
    ) -> None:
        relay = _Relay(writer, response, self._clock)
        try:
            await response.relay(relay)
        finally:
            if relay.first_at is not None:
                self._metrics.first_token(routing.model, relay.first_at - started)
        writer.end()


class _Relay:
    """Passes upstream chunks straight to the client, from the socket callback: the chunks of
    one read leave in one write (when the gateway is busy, reads bring several).

    When the client falls behind, the upstream socket is paused until it catches up, so a slow
    reader never makes the gateway buffer a whole answer.
    """

    __slots__ = ("_clock", "_pending", "_response", "_writer", "first_at")

    def __init__(
        self, writer: ResponseWriter, response: UpstreamResponse, clock: Callable[[], float]
    ) -> None:
        self._writer = writer
        self._response = response
        self._clock = clock
        self._pending: list[bytes] = []
        self.first_at: float | None = None

    def chunk(self, data: bytes) -> None:
        self._pending.append(data)

    def flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if self.first_at is None:
            self.first_at = self._clock()
        writer = self._writer
        if pending[-1].endswith(_DONE):  # the stream's last event: end it in the same write
            writer.end_with(pending)
            return
        writer.write_chunks(pending)
        if writer.paused:
            self._response.pause_reading()
            writer.when_drained(self._response.resume_reading)
