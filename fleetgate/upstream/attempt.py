"""One attempt: a client's request sent to one backend, and its answer relayed to the client.

An attempt reports what happened through the lifecycle's events (AttemptStarted, FirstToken,
AttemptEnded) and tells its caller (resilience/failover.py) only what it needs to decide the
next step: nothing (the client has its answer), a `Failed` attempt that sent nothing to the
client and may be tried elsewhere, or a `Broken` stream that the client has part of.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.load_board import LoadBoard
from fleetgate.http.errors import (
    ConnectError,
    LocalExhaustion,
    ProtocolError,
    ReadError,
    UpstreamError,
    UpstreamTimeout,
)
from fleetgate.http.forwarding import returned
from fleetgate.http.transport import Transport, UpstreamAnswer
from fleetgate.lifecycle.downstream import Downstream
from fleetgate.lifecycle.events import (
    NO_BACKEND,
    AttemptKind,
    AttemptStarted,
    CacheResult,
    ErrorKind,
)
from fleetgate.lifecycle.hooks import Emitters
from fleetgate.openai_api import JSON, SSE_HEADERS, Usage, error_body, response_id_of, usage_of
from fleetgate.routing.base import RoutingRequest
from fleetgate.upstream.bracket import Bracket
from fleetgate.upstream.progress import StreamProgress
from fleetgate.upstream.relay import StreamRelay
from fleetgate.upstream.responses_progress import ResponsesProgress
from fleetgate.upstream.timeouts import Timeouts

Claim = Callable[[], bool]  # True if this attempt has (now) the client: resilience/hedge.py
_SSE_NAMES = frozenset(name for name, _ in SSE_HEADERS)  # a stream's, whatever the upstream's


class Exchange(msgspec.Struct):
    """One client request as it is tried on the backends of its pool (a struct: made in C,
    half the time of a dataclass's __init__)."""

    model: str  # the pool's
    routing: RoutingRequest
    path: bytes
    headers: list[tuple[bytes, bytes]]  # what goes upstream
    body: bytes
    request_id: bytes
    writer: Downstream
    started: float
    timeouts: Timeouts  # the pool's, or shorter where the client asked (gateway/requests.py)
    emit: Emitters
    board: LoadBoard  # the pool's in-flight counts (fleet/load_board.py), read as it is sent
    pool_timeouts: Timeouts | None = None  # the pool's own (None: `timeouts` are)
    tried: list[BackendState] = msgspec.field(default_factory=list)
    # The last 5xx an attempt got, and the backend it still counts against (None once a like
    # answer from another backend showed it to be the request's): lifecycle/events.py.
    prior_status: int = 0
    prior_backend: str | None = None  # by id
    # What the client got, for the Finished event.
    backend: str = NO_BACKEND  # whose answer
    ttft_s: float | None = None
    progress: StreamProgress | None = None  # of the stream the client has, if any
    # Headers of the gateway's own for the answer (a limited tenant's x-ratelimit-*).
    reply_head: bytes = b""  # the gateway's own header lines for the client (x-ratelimit-*)
    count_usage: bool = False  # read the answer's `usage` (its tenant's tokens are counted)
    batch: bool = False  # in the batch lane
    priority: int = 1  # its class (traffic/priority.py)
    tenant: str = ""  # whose request, and its class's name, once admitted
    priority_label: str = ""
    queued_s: float | None = None  # its wait for admission (None: not admitted)
    attempts: int = 0  # tries sent (first, retries, hedges, continuations, prefill)
    usage: Usage | None = None  # what the engine said the answer used, when read
    # What its tokens cost at its pool's prices (`pricing.cost_usd`; None: no prices).
    price: Callable[[int, int], float] | None = None
    response_id: str = ""  # a Response's id (its stream's: `progress.id`), for follow-ups
    cache: CacheResult = ""  # the response cache's part (director/cache.py)
    deadline: float = 0.0  # when the total timeout ends the whole exchange (set from started)
    _use: tuple[int, int] | None = None  # `used()`, once read
    _use_read: bool = False

    def __post_init__(self) -> None:
        self.deadline = self.started + self.timeouts.total_s

    def used(self) -> tuple[int, int] | None:
        """The prompt and completion tokens the request used, read once it is over (for
        Finished and its tenant's limits): the engine's `usage` when the answer had one (a
        stream's too, when it sent one); else for a stream the estimated prompt and its
        output tokens estimated from its text (upstream/progress.py); nothing for an error
        the client got instead of an answer; None (keep what was reserved) for an answer
        whose use is unknown."""
        if not self._use_read:
            self._use_read = True
            usage = self.usage  # a whole answer's: the common case, read without a call
            if usage is not None:
                self._use = (usage.prompt_tokens, usage.completion_tokens)
            else:
                self._use = self._read_use()
        return self._use

    def _read_use(self) -> tuple[int, int] | None:
        progress = self.progress
        if progress is not None:
            progress.settle()  # decodes what is left of it (it decodes in batches of 64 events)
            if progress.reported is not None:  # the engine's own count
                return progress.reported.prompt_tokens, progress.reported.completion_tokens
            return self.routing.prompt_tokens, progress.tokens
        if self.writer.status == 200:
            return None
        return 0, 0


@dataclass(slots=True)
class Failed:
    """An attempt that failed before any byte reached the client: retry it, or answer it."""

    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]]
    unsent: bool = False  # the connection never opened: the backend did no work for it


@dataclass(slots=True)
class Broken:
    """A stream that broke off after the client had part of it: continue it, or end it."""

    progress: StreamProgress
    error: UpstreamError


def error_kind(exc: UpstreamError) -> ErrorKind:
    """What went wrong, as events and metrics name it."""
    if isinstance(exc, UpstreamTimeout):
        return "timeout"
    if isinstance(exc, ConnectError):
        return "connect"
    if isinstance(exc, LocalExhaustion):
        return "local_resources"
    if isinstance(exc, ProtocolError):
        return "protocol"
    return "read"


def error_code(exc: UpstreamError) -> str:
    """The `code` of the error the client gets for it."""
    if isinstance(exc, UpstreamTimeout):
        return "upstream_timeout"
    return "gateway_overloaded" if isinstance(exc, LocalExhaustion) else "upstream_error"


def timeout_kind(ex: Exchange, exc: UpstreamTimeout, sent: float, now: float) -> ErrorKind:
    """`client_timeout` when the deadline that ran out is one the client shortened and the
    pool's own would not have run out yet (the transport fires a deadline within a tick after
    it passes, so a pool's own timeout always finds its deadline passed); else `timeout`."""
    pool = ex.pool_timeouts
    if pool is None or pool is ex.timeouts:
        return "timeout"
    if exc.phase == "idle":
        return "client_timeout" if ex.timeouts.idle_s < pool.idle_s else "timeout"
    pool_deadline = ex.started + pool.total_s
    if exc.phase == "head":  # the head's wait was bounded by the first-byte and total limits
        pool_deadline = min(pool_deadline, sent + pool.first_byte_s)
    return "client_timeout" if now < pool_deadline else "timeout"


def retry_after_s(value: bytes | None) -> float | None:
    """Retry-After in seconds; None when absent (an HTTP date or garbage counts as one)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return 1.0


class Attempts:
    """Sends attempts through a transport, reading time from the injected clock."""

    def __init__(
        self,
        transport: Transport,
        clock: Callable[[], float],
        traceparent: Callable[[bytes, str], bytes | None] | None = None,
    ) -> None:
        self._transport = transport
        self._clock = clock
        # With tracing on: the `traceparent` of a request's attempt to a backend (its span's),
        # replacing the client's (None: the request is not traced).
        self._traceparent = traceparent

    def _send(self, ex: Exchange, state: BackendState, body: bytes) -> Awaitable[UpstreamAnswer]:
        """The request on its way: the transport's own awaitable (not a coroutine of ours
        around it: one frame fewer per request), its head due within the first-byte timeout
        or what is left of the total."""
        t, backend = ex.timeouts, state.backend
        headers = [*ex.headers, *backend.credentials] if backend.credentials else ex.headers
        if self._traceparent is not None:
            traced = self._traceparent(ex.request_id, backend.id)
            if traced is not None:
                headers = [h for h in headers if h[0] != b"traceparent"]
                headers.append((b"traceparent", traced))
        return self._transport.request(
            backend.origin, b"POST", ex.path, headers, body,
            timeout_s=max(0.0, min(t.first_byte_s, ex.deadline - self._clock())),
            connect_timeout_s=t.connect_s,
        )  # fmt: skip

    def _error_kind(self, ex: Exchange, exc: UpstreamError, sent: float) -> ErrorKind:
        if isinstance(exc, UpstreamTimeout):
            return timeout_kind(ex, exc, sent, self._clock())
        return error_kind(exc)

    def _expire(self, ex: Exchange, response: UpstreamAnswer) -> None:
        """The rest of the answer's deadlines (http/deadlines.py): the total and the idle."""
        t = ex.timeouts
        left_s = max(0.0, ex.deadline - self._clock())
        response.expire_in(left_s, t.total_message, t.idle_s, t.idle_message)

    async def run(
        self,
        ex: Exchange,
        state: BackendState,
        kind: AttemptKind,
        retry_on: frozenset[int],
        claim: Claim | None = None,
    ) -> Failed | Broken | None:
        """One try on one backend: None when the client has its answer; `Failed` when nothing
        reached the client (and, for an answer, its status is in `retry_on`); `Broken` when a
        stream broke off after the client had part of it."""
        clock, emit, routing = self._clock, ex.emit, ex.routing
        sent = clock()
        # The prompt tokens sent there before this one, not yet prefilled.
        queued = ex.board.load(state.backend.id).pending_prefill
        ex.attempts += 1
        events = Bracket(emit, AttemptStarted(
            request_id=ex.request_id, at=sent, model=ex.model, backend=state.backend.id,
            kind=kind, prompt_tokens=routing.prompt_tokens, queued_prefill=queued,
        ))  # fmt: skip
        ex.backend = state.backend.id  # until an answer reaches the client: the last tried
        status = 0
        error: ErrorKind | None = None
        wait_s: float | None = None
        first_at: float | None = None
        streamed: StreamProgress | None = None
        try:
            response = await self._send(ex, state, ex.body)
            self._expire(ex, response)
            status = response.status
            if routing.stream and status == 200:
                progress = streamed = (
                    ResponsesProgress() if routing.endpoint == "responses" else StreamProgress()
                )

                def start() -> bool:
                    nonlocal first_at
                    first_at = now = clock()
                    won = claim is None or claim()
                    ttft = now - ex.started if won else None
                    events.first_token(at=now, ttft_s=ttft, batch=ex.batch)
                    if won:
                        ex.ttft_s, ex.backend, ex.progress = ttft, state.backend.id, progress
                        upstream = [
                            h
                            for h in returned(response.headers, bool(ex.reply_head))
                            if h[0] not in _SSE_NAMES
                        ]
                        head = [*SSE_HEADERS, *upstream, (b"x-request-id", ex.request_id)]
                        ex.writer.start(200, head, ex.reply_head)
                    return won

                relay = StreamRelay(ex.writer, response, clock, progress, None, start)
                try:
                    await _relay(response, relay, progress)
                except UpstreamError as exc:
                    if relay.first_at is None:  # nothing reached the client: an ordinary retry
                        raise
                    error = self._error_kind(ex, exc, sent)
                    return Broken(progress, exc)
                return None
            if status >= 400:  # an engine asks for no traffic for a while with an error
                wait_s = retry_after_s(response.header(b"retry-after"))
            data = await response.read()
            if status not in retry_on:  # the client's answer first, the bookkeeping after it
                if claim is None or claim():
                    self._answer(ex, state, response, data)
                return None
        except UpstreamError as exc:
            error = self._error_kind(ex, exc, sent)
            headers = [(b"content-type", JSON)]
            if isinstance(exc, LocalExhaustion):  # the gateway's own trouble, for a moment
                answer, message = 503, "The gateway is overloaded; retry shortly."
                headers.append((b"retry-after", b"1"))
            else:
                answer = 504 if isinstance(exc, UpstreamTimeout) else 502
                # The backend's name, never its address: the request log and metrics have it.
                message = f"Backend {state.backend.name} failed: {exc}"
            body = error_body(answer, message, code=error_code(exc))
            unsent = isinstance(exc, ConnectError | LocalExhaustion)
            return Failed(answer, body, headers, unsent)
        except asyncio.CancelledError:
            error = "cancelled"
            raise
        except Exception:
            error = "gateway"
            raise
        finally:
            tokens = 0
            if streamed is not None:
                streamed.settle()  # decoded now rather than at its Finished: no more work
                tokens = streamed.tokens
            events.ended(
                at=clock(), status=status, error=error, retry_after_s=wait_s,
                first_token_at=first_at, output_tokens=tokens, stream=streamed is not None,
                prior_status=ex.prior_status, prior_backend=ex.prior_backend,
                priority=ex.priority,
            )  # fmt: skip
            if status >= 500:
                if status == ex.prior_status:
                    ex.prior_backend = None  # taken back now, and this one never counted
                else:
                    ex.prior_status, ex.prior_backend = status, state.backend.id
        return Failed(status, data, _reply(ex, response))

    @staticmethod
    def _answer(ex: Exchange, state: BackendState, response: UpstreamAnswer, data: bytes) -> None:
        """Send the client the backend's whole answer."""
        status = response.status
        ex.backend = state.backend.id
        if ex.count_usage and status == 200:
            ex.usage = usage_of(data)
        if ex.routing.endpoint == "responses" and status == 200:
            ex.response_id = response_id_of(data)
        reply = _reply(ex, response)
        reply.append((b"x-request-id", ex.request_id))
        ex.writer.send(status, reply, data, ex.reply_head)

    async def resume(
        self,
        ex: Exchange,
        state: BackendState,
        body: bytes,
        progress: StreamProgress,
        rewrite: Callable[[bytes], bytes],
    ) -> UpstreamError | None:
        """A continuation on `state`: the rest of the stream `progress` has recorded, its
        events rewritten (resilience/continuation.py) into the stream the client has. None
        when the stream ended well, else why it broke again."""
        clock, emit = self._clock, ex.emit
        sent = clock()
        queued = ex.board.load(state.backend.id).pending_prefill
        ex.attempts += 1
        events = Bracket(emit, AttemptStarted(
            request_id=ex.request_id, at=sent, model=ex.model, backend=state.backend.id,
            kind="continuation", prompt_tokens=0, queued_prefill=queued,
        ))  # fmt: skip
        status = 0
        error: ErrorKind | None = None
        first_at: float | None = None
        progress.settle()
        tokens = progress.tokens  # sent before this continuation
        wait_s: float | None = None
        try:
            response = await self._send(ex, state, body)
            self._expire(ex, response)
            status = response.status
            if status != 200:  # judged by its status (outlier.py), not as a broken stream
                wait_s = retry_after_s(response.header(b"retry-after"))
                await response.read()
                return ReadError(f"the continuation was answered {status}")

            def start() -> bool:  # the client has had its head already
                nonlocal first_at
                first_at = now = clock()
                events.first_token(at=now, ttft_s=None, batch=ex.batch)
                return True

            relay = StreamRelay(ex.writer, response, clock, progress, rewrite, start)
            await _relay(response, relay, progress)
            ex.backend = state.backend.id
            return None
        except UpstreamError as exc:
            error = self._error_kind(ex, exc, sent)
            return exc
        except asyncio.CancelledError:
            error = "cancelled"
            raise
        except Exception:
            error = "gateway"
            raise
        finally:
            progress.settle()
            events.ended(
                at=clock(), status=status, error=error, retry_after_s=wait_s,
                first_token_at=first_at,
                # an estimate before, the engine's whole count after: never below 0
                output_tokens=max(0, progress.tokens - tokens), stream=status == 200,
            )  # fmt: skip


def _reply(ex: Exchange, response: UpstreamAnswer) -> list[tuple[bytes, bytes]]:
    """The headers of the upstream's answer that go on to the client (its Retry-After too:
    the client may wait as it asked)."""
    reply = returned(response.headers, bool(ex.reply_head))
    if response.header(b"content-type") is None:
        reply.append((b"content-type", JSON))
    return reply


async def _relay(response: UpstreamAnswer, relay: StreamRelay, progress: StreamProgress) -> None:
    """Relay a stream's events; raise `UpstreamError` if it breaks off before [DONE]."""
    await response.relay(relay)
    if not progress.done:
        raise ReadError("the stream ended without [DONE]")
