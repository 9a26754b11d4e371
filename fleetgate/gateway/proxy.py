"""The proxy path: pick a backend, forward the body's bytes, relay the answer chunk by chunk."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.pool import Pool, Timeouts
from fleetgate.gateway.errors import error_body, error_event
from fleetgate.gateway.relay import StreamRelay
from fleetgate.gateway.requests import handoff_params, prefill_body, with_fields
from fleetgate.http.client import HttpClient
from fleetgate.http.errors import (
    ConnectError,
    ProtocolError,
    ReadError,
    UpstreamError,
    UpstreamTimeout,
)
from fleetgate.http.response import UpstreamResponse
from fleetgate.http.writer import ResponseWriter
from fleetgate.observe.metrics import NO_BACKEND, GatewayMetrics
from fleetgate.resilience.continuation import Splicer, StreamProgress, continuation_body
from fleetgate.resilience.hedge import Race
from fleetgate.resilience.retry import RETRYABLE_STATUSES, backoff_s
from fleetgate.routing.base import RoutingRequest

_JSON = b"application/json"
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


@dataclass(slots=True)
class _Exchange:
    """One client request as it is tried on the backends of its pool."""

    pool: Pool
    routing: RoutingRequest
    path: bytes
    headers: list[tuple[bytes, bytes]]  # what goes upstream
    body: bytes
    request_id: bytes
    writer: ResponseWriter
    started: float
    timeouts: Timeouts
    tried: list[BackendState]


@dataclass(slots=True)
class _Failed:
    """An attempt that failed before any byte reached the client: retry it, or answer it."""

    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]]
    backend: str
    unsent: bool = False  # the connection never opened: the backend did no work for it


class Proxy:
    """Forwards one routed request to a backend of its pool, trying another when one fails
    before the first byte has gone to the client (resilience/retry.py says when)."""

    def __init__(
        self,
        client: HttpClient,
        metrics: GatewayMetrics,
        clock: Callable[[], float],
        rng: random.Random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._client = client
        self._metrics = metrics
        self._clock = clock
        self._rng = rng
        self._sleep = sleep

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
        timeouts: Timeouts,
    ) -> None:
        upstream_headers = [(b"content-type", _JSON), (b"x-request-id", request_id)]
        for name in _FORWARDED:
            value = headers.get(name)
            if value is not None:
                upstream_headers.append((name, value))
        if pool.prefill is not None and routing.endpoint != "embeddings":
            body = await self._prefill(pool.prefill, routing, path, upstream_headers, body)
        tried: list[BackendState] = []
        exchange = _Exchange(
            pool, routing, path, upstream_headers, body, request_id, writer, started, timeouts,
            tried,
        )  # fmt: skip
        failed: _Failed | None = None
        status = 499  # nginx's "client closed request", if the client leaves first
        backend_id = NO_BACKEND
        try:
            for attempt in range(pool.retries.max_attempts):
                now = self._clock()
                state = pool.pick_other(routing, now, tried) if tried else pool.pick(routing, now)
                if state is None:
                    break
                if tried:
                    # A retry after a failed connect adds no work to the fleet: it is the
                    # first the request puts there, so the budget does not count it.
                    counted = 0 if failed is not None and failed.unsent else 1
                    if counted and not pool.budget.allows(pool.in_flight):
                        self._metrics.retry_refused(routing.model)
                        break
                    self._metrics.retry(routing.model)
                    pool.budget.retrying += counted
                    try:
                        await self._sleep(backoff_s(pool.retries, attempt, self._rng))
                    finally:
                        pool.budget.retrying -= counted
                tried.append(state)
                backend_id = state.backend.id
                last = attempt + 1 == pool.retries.max_attempts
                if attempt == 0 and routing.stream and pool.hedge.enabled:
                    failed = await self._hedged(exchange, state, last)
                else:
                    failed = await self._attempt(exchange, state, last)
                if failed is None:
                    status = writer.status
                    return
            status = self._answer_failure(routing, failed, writer, request_id)
        finally:
            self._metrics.request_done(routing.model, backend_id, status, self._clock() - started)

    async def _hedged(self, ex: _Exchange, state: BackendState, last: bool) -> _Failed | None:
        """The first attempt, with a second on another backend if its first token is late
        (resilience/hedge.py); the first to produce a token keeps the client."""
        loop = asyncio.get_running_loop()
        pool = ex.pool
        race = Race()
        first = loop.create_task(self._attempt(ex, state, last, race.claimer(0)))
        race.tasks.append(first)
        try:
            done, _ = await asyncio.wait({first}, timeout=pool.hedge.delay_s(pool.ttft))
            other = None
            if not done and race.winner is None and pool.budget.allows(pool.in_flight):
                other = pool.pick_other(ex.routing, self._clock(), ex.tried)
            if other is None:
                return await first
            ex.tried.append(other)
            self._metrics.hedge(ex.routing.model)
            pool.budget.retrying += 1
            try:
                second = loop.create_task(self._attempt(ex, other, last, race.claimer(1)))
                race.tasks.append(second)
                return await _first_answer({first, second})
            finally:
                pool.budget.retrying -= 1
        finally:
            for task in race.tasks:
                task.cancel()

    def _answer_failure(
        self,
        routing: RoutingRequest,
        failed: _Failed | None,
        writer: ResponseWriter,
        request_id: bytes,
    ) -> int:
        if failed is None:
            body = error_body(
                503, f"No healthy backend serves {routing.model!r} right now; retry shortly."
            )
            headers = [(b"content-type", _JSON), (b"retry-after", b"1")]
            failed = _Failed(503, body, headers, NO_BACKEND)
        writer.send(failed.status, [*failed.headers, (b"x-request-id", request_id)], failed.body)
        return failed.status

    async def _prefill(
        self,
        pool: Pool,
        routing: RoutingRequest,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> bytes:
        """The prefill half of a disaggregated request (vLLM's protocol): one token on a
        prefill backend, whose answer's kv_transfer_params go into the body the decode
        backend gets. Any failure leaves the body as it was: the decode backend then prefills
        the prompt itself, slower but answered."""
        now = self._clock()
        state = pool.pick(routing, now)
        if state is None:
            return body
        prompt = routing.prompt_tokens
        pool.begin(state, now, prompt)
        try:
            response = await self._client.request(
                state.backend.origin, b"POST", path, headers, prefill_body(body),
                timeout_s=pool.timeouts.first_byte_s, connect_timeout_s=pool.timeouts.connect_s,
            )  # fmt: skip
            response.expire_in(pool.timeouts.total_s, pool.timeouts.total_message)
            answer = await response.read()
        except UpstreamError as exc:
            self._report_error(pool, state, routing, exc)
            return body
        finally:
            pool.end(state, self._clock(), prompt, prompt)
        params = handoff_params(answer) if response.status == 200 else None
        if params is None:
            if response.status >= 500:
                pool.failed(state, self._clock())
            return body
        pool.succeeded(state, self._clock())
        return with_fields(body, kv_transfer_params=params)

    async def _attempt(
        self,
        ex: _Exchange,
        state: BackendState,
        last: bool,
        claim: Callable[[], bool] | None = None,
    ) -> _Failed | None:
        """One try on one backend: None when the client has its answer (or part of a stream);
        a `_Failed` when nothing was sent and another backend may be tried."""
        pool, routing, writer, timeouts = ex.pool, ex.routing, ex.writer, ex.timeouts
        request_id, started = ex.request_id, ex.started
        backend = state.backend
        sent = self._clock()
        # Timeouts are deadlines on the upstream exchange itself (http/deadlines.py).
        deadline = started + timeouts.total_s
        prompt = routing.prompt_tokens
        ahead = state.pending_prefill  # prompt tokens sent before this one, not yet prefilled
        pool.begin(state, self._clock(), prompt)
        unprefilled = prompt  # until the first token: what the backend still has to prefill
        released = False
        try:
            response = await self._client.request(
                backend.origin, b"POST", ex.path, ex.headers, ex.body,
                timeout_s=max(0.0, min(timeouts.first_byte_s, deadline - self._clock())),
                connect_timeout_s=timeouts.connect_s,
            )  # fmt: skip
            _set_body_deadlines(response, deadline - self._clock(), timeouts)
            status = response.status
            if routing.stream and status == 200:
                progress = StreamProgress()

                def start() -> bool:
                    nonlocal unprefilled
                    pool.prefilled(state, unprefilled)
                    unprefilled = 0
                    if claim is not None and not claim():
                        return False
                    writer.start(200, [*_SSE_HEADERS, (b"x-request-id", request_id)])
                    return True

                try:
                    first_at = await self._relay_stream(ex, response, progress, None, start)
                except UpstreamError as exc:
                    if not writer.started:  # nothing reached the client: an ordinary retry
                        raise
                    self._report_error(pool, state, routing, exc)
                    pool.end(state, self._clock(), prompt, unprefilled)
                    released = True  # what follows is other backends' work
                    await self._continue(ex, progress, exc)
                    return None
                now = self._clock()
                pool.succeeded(state, now)
                if first_at is not None:
                    # One event per token from a streaming engine (an opening role event
                    # counts one over, on every backend alike): no decoding needed.
                    state.latency.record_stream(
                        first_at - sent, now - sent, progress.events, ahead + prompt
                    )
                return None
            data = await response.read()
        except UpstreamError as exc:
            self._report_error(pool, state, routing, exc)
            status = 504 if isinstance(exc, UpstreamTimeout) else 502
            message = f"Backend {backend.id} failed: {exc}"
            return _Failed(
                status, error_body(status, message, code=_code(exc)),
                [(b"content-type", _JSON)], backend.id, isinstance(exc, ConnectError),
            )  # fmt: skip
        finally:
            if not released:
                pool.end(state, self._clock(), prompt, unprefilled)
        reply = [(b"content-type", response.header(b"content-type") or _JSON)]
        retry_after = response.header(b"retry-after")  # an engine's backpressure
        if retry_after is not None:
            reply.append((b"retry-after", retry_after))
        now = self._clock()
        if status == 429 or (status == 503 and retry_after is not None):
            pool.backpressure(state, now, _seconds(retry_after))
        elif status >= 500:
            pool.failed(state, now)
        else:
            pool.succeeded(state, now)  # a 4xx is the request's fault, not the backend's
            if status < 400:
                state.latency.record_response(now - sent)
        if status in RETRYABLE_STATUSES and not last:
            return _Failed(status, data, reply, backend.id)
        if claim is None or claim():
            writer.send(status, [*reply, (b"x-request-id", request_id)], data)
        return None

    def _report_error(
        self, pool: Pool, state: BackendState, routing: RoutingRequest, exc: UpstreamError
    ) -> None:
        self._metrics.upstream_error(routing.model, state.backend.id, _error_kind(exc))
        pool.failed(state, self._clock())

    async def _relay_stream(
        self,
        ex: _Exchange,
        response: UpstreamResponse,
        progress: StreamProgress,
        rewrite: Callable[[bytes], bytes] | None,
        start: Callable[[], bool],
    ) -> float | None:
        """Relay a stream's events; raise `UpstreamError` if it breaks off before [DONE].
        Returns when its first event went out (None if none did)."""
        relay = StreamRelay(ex.writer, response, self._clock, progress, rewrite, start)
        try:
            await response.relay(relay)
        finally:
            if relay.first_at is not None and rewrite is None:
                ttft = relay.first_at - ex.started
                self._metrics.first_token(ex.routing.model, ttft)
                ex.pool.ttft.add(ttft)
        if not progress.done:
            raise ReadError("the stream ended without [DONE]")
        return relay.first_at

    async def _continue(self, ex: _Exchange, progress: StreamProgress, exc: UpstreamError) -> None:
        """Finish a broken stream on other backends (resilience/continuation.py), or end it
        with an error event: never silently."""
        pool, routing, writer, timeouts = ex.pool, ex.routing, ex.writer, ex.timeouts
        chat = routing.endpoint == "chat"
        deadline = ex.started + timeouts.total_s
        for _ in range(pool.retries.max_attempts - 1):
            progress.settle()
            if progress.finished:  # only [DONE] was missing: nothing left to generate
                writer.end(b"data: [DONE]\n\n")
                return
            rest = continuation_body(ex.body, chat, progress)
            state = pool.pick_other(routing, self._clock(), ex.tried)
            if rest is None or state is None:
                break
            ex.tried.append(state)
            self._metrics.continuation(routing.model)
            pool.begin(state, self._clock())
            try:
                response = await self._client.request(
                    state.backend.origin, b"POST", ex.path, ex.headers, rest,
                    timeout_s=max(0.0, min(timeouts.first_byte_s, deadline - self._clock())),
                    connect_timeout_s=timeouts.connect_s,
                )  # fmt: skip
                _set_body_deadlines(response, deadline - self._clock(), timeouts)
                if response.status != 200:
                    await response.read()
                    raise ReadError(f"the continuation was answered {response.status}")
                splicer = Splicer(progress)
                await self._relay_stream(ex, response, progress, splicer.rewrite, _started)
                pool.succeeded(state, self._clock())
                return
            except UpstreamError as again:
                self._report_error(pool, state, routing, again)
                exc = again
            finally:
                pool.end(state, self._clock())
        writer.end(error_event(502, f"The stream broke off and could not go on: {exc}", _code(exc)))


def _set_body_deadlines(response: UpstreamResponse, left_s: float, t: Timeouts) -> None:
    response.expire_in(max(0.0, left_s), t.total_message, t.idle_s, t.idle_message)


async def _first_answer(tasks: set[asyncio.Task[_Failed | None]]) -> _Failed | None:
    """None as soon as one attempt has answered the client; else the last failure."""
    failed: _Failed | None = None
    pending = tasks
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task.cancelled():
                continue  # lost the race: the winner cancelled it
            result = task.result()
            if result is None:
                return None
            failed = result
    return failed


def _started() -> bool:
    return True  # a continuation's client has had its head already


def _code(exc: UpstreamError) -> str:
    return "upstream_timeout" if isinstance(exc, UpstreamTimeout) else "upstream_error"


def _seconds(retry_after: bytes | None) -> float:
    """Retry-After in seconds (an HTTP date or garbage counts as one second)."""
    try:
        return max(0.0, float(retry_after or b"1"))
    except ValueError:
        return 1.0
