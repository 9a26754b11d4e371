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
        try:
            response = await self._client.request(
                backend.origin, b"POST", path, upstream_headers, body
            )
            status = response.status
            if routing.stream and status == 200:
                await self._relay_stream(routing, response, writer, request_id, started)
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
            self._metrics.upstream_error(routing.model, backend.id, _error_kind(exc))
            status = 502
            if not writer.started:
                writer.send(
                    502,
                    [(b"content-type", _JSON), (b"x-request-id", request_id)],
                    error_body(502, f"Backend {backend.id} failed: {exc}", code="upstream_error"),
                )
        except asyncio.CancelledError:
            status = 499  # nginx's "client closed request"
            raise
        finally:
            pool.end(state)
            self._metrics.request_done(routing.model, backend.id, status, self._clock() - started)

    async def _relay_stream(
        self,
        routing: RoutingRequest,
        response: UpstreamResponse,
        writer: ResponseWriter,
        request_id: bytes,
        started: float,
    ) -> None:
        writer.start(200, [*_SSE_HEADERS, (b"x-request-id", request_id)])
        relay = _Relay(writer, response, self._clock)
        try:
            await response.relay(relay.chunk)
        except UpstreamError as exc:
            message = f"The backend failed mid-stream: {exc}"
            writer.write(error_event(502, message, "upstream_error"))
            writer.end()
            raise
        finally:
            if relay.first_at is not None:
                self._metrics.first_token(routing.model, relay.first_at - started)
        writer.end()


class _Relay:
    """Passes each upstream chunk straight to the client, from the socket callback.

    When the client falls behind, the upstream socket is paused until it catches up, so a slow
    reader never makes the gateway buffer a whole answer.
    """

    __slots__ = ("_clock", "_response", "_writer", "first_at")

    def __init__(
        self, writer: ResponseWriter, response: UpstreamResponse, clock: Callable[[], float]
    ) -> None:
        self._writer = writer
        self._response = response
        self._clock = clock
        self.first_at: float | None = None

    def chunk(self, data: bytes) -> None:
        if self.first_at is None:
            self.first_at = self._clock()
        if data.endswith(_DONE):  # the stream's last event: end it in the same write
            self._writer.end(data)
            return
        self._writer.write(data)
        if self._writer.paused:
            self._response.pause_reading()
            self._writer.when_drained(self._response.resume_reading)
