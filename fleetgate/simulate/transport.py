"""The gateway's way to the simulated fleet: a `Transport` (http/transport.py) that takes its
requests to the replicas (simulate/replica.py), as the HTTP client takes them to real engines.

A stream costs a few events, not one per token: its head and first chunk come with the first
token, the rest of the answer in one chunk at its end (its text 4 bytes a token, so the
gateway counts its tokens as it would one chunk a token). A non-stream answer comes whole at
its end. Everything the HTTP client enforces is kept at its deadline: the first-byte timeout
(an answer's head later than `timeout_s`), the total (`expire_in`), a backend that is down
(the connection refused) or dies with requests on it (the connection reset: before the head
the attempt fails and is retried, after it the stream is broken and continued elsewhere). The
idle timeout is not: an engine that is up keeps its streams moving.

A continuation (an assistant message at the end of the messages, resilience/continuation.py)
is a new request for the rest: its prompt the original plus what was generated, its answer
what was left. A request is known by its `x-request-id`: `Fleet.expect` registers it first.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from fleetgate.http.client import Origin
from fleetgate.http.errors import ConnectError, ReadError, TimeoutPhase, UpstreamTimeout
from fleetgate.http.response import RelaySink
from fleetgate.routing.base import BYTES_PER_TOKEN
from fleetgate.simulate.engine import Job
from fleetgate.simulate.replica import Flight, SimBackend
from fleetgate.simulate.workload import SimRequest

_SSE = ((b"content-type", b"text/event-stream"),)
_JSON = ((b"content-type", b"application/json"),)
_TEXT = b"abcd"  # one token of answer: 4 bytes, the gateway's estimate
_FIRST = (
    b'data: {"id":"sim","object":"chat.completion.chunk","created":0,"model":"sim",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":"abcd"},'
    b'"finish_reason":null}]}\n\n'
)
_REQUEST_ID = b"x-request-id"


class _Message(msgspec.Struct):
    role: str = ""
    content: str | None = None


class _Body(msgspec.Struct):
    messages: list[_Message] = []


_BODY = msgspec.json.Decoder(_Body)


@dataclass
class Fleet:
    """Every simulated backend by origin, and the requests on their way to them."""

    backends: Mapping[Origin, SimBackend]
    requests: dict[bytes, SimRequest] = field(default_factory=dict)  # by x-request-id
    keys: Callable[[], int] = field(default_factory=lambda: itertools.count().__next__)

    def expect(self, request_id: bytes, request: SimRequest) -> None:
        """`request` will come with this x-request-id (until `done`)."""
        self.requests[request_id] = request

    def done(self, request_id: bytes) -> None:
        self.requests.pop(request_id, None)


class VirtualTransport:
    """One gateway's transport to the simulated fleet (`Transport`, http/transport.py): a
    request and its answer each cross the network between the gateway's region and the
    replica's (`latency`: one way, by the replica's region)."""

    def __init__(self, fleet: Fleet, loop: asyncio.AbstractEventLoop,
                 latency: Callable[[str], float] = lambda region: 0.0) -> None:  # fmt: skip
        self._fleet = fleet
        self._loop = loop
        self._latency = latency

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
    ) -> VirtualAnswer:
        backend = self._fleet.backends.get(origin)
        hop = 0.0 if backend is None else self._latency(backend.region)
        if hop:  # the request on its way
            await asyncio.sleep(hop)
        if backend is None or not backend.up:
            raise ConnectError("connection refused")
        if method != b"POST":  # a health probe: up is healthy, if it answers in time
            if timeout_s is not None and 2 * hop > timeout_s:
                await asyncio.sleep(timeout_s - hop)
                raise UpstreamTimeout(f"no answer within {timeout_s:g} s (the first-byte timeout)")
            if hop:
                await asyncio.sleep(hop)
            return VirtualAnswer(None, backend, b"{}", self._loop)
        try:
            flight = backend.submit(self._job(headers, body))
        except ValueError as exc:  # a prompt the engine refuses: its 400, as the worker's
            return VirtualAnswer(None, backend, _refusal(str(exc)), self._loop, status=400)
        first = flight.first
        timer = None
        if timeout_s is not None and math.isfinite(timeout_s):
            message = f"no answer within {timeout_s:g} s (the first-byte timeout)"
            # The head must leave the replica a hop before the deadline to make it.
            timer = self._loop.call_later(timeout_s - 2 * hop, _fail, first, message, "head")
        try:
            await first
            if hop:  # the head on its way back
                await asyncio.sleep(hop)
        except BaseException:
            backend.abort(flight)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return VirtualAnswer(flight, backend, b'"stream":true' in body, self._loop, hop)

    def _job(self, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> Job:
        request_id = next((v for k, v in headers if k == _REQUEST_ID), b"")
        request = self._fleet.requests.get(request_id)
        if request is None:  # not a client's: an inference health probe ("ping", 1 token)
            return Job(self._fleet.keys(), 1, 1)
        prompt, output = request.prompt_tokens, request.output_tokens
        if b'"role":"assistant"' in body:  # a continuation: the rest of the answer
            said = _BODY.decode(body).messages[-1].content or ""
            done = len(said.encode()) // BYTES_PER_TOKEN
            prompt, output = prompt + done, max(1, output - done)
        return Job(self._fleet.keys(), prompt, output, request.blocks)


def _refusal(message: str) -> bytes:
    return msgspec.json.encode({"error": {"message": message, "type": "invalid_request_error",
                                          "param": "max_tokens", "code": None}})  # fmt: skip


def _fail(future: asyncio.Future[float], message: str, phase: TimeoutPhase) -> None:
    """A deadline passed: its UpstreamTimeout (made only now: most deadlines never pass)."""
    if not future.done():
        future.set_exception(UpstreamTimeout(message, phase))


class VirtualAnswer:
    """An answer whose head has come (`UpstreamAnswer`, http/transport.py)."""

    def __init__(self, flight: Flight | None, backend: SimBackend, stream: bool | bytes,
                 loop: asyncio.AbstractEventLoop, hop: float = 0.0,
                 status: int = 200) -> None:  # fmt: skip
        self._flight = flight
        self._hop = hop  # one way between the gateway and the replica
        self._backend = backend
        self._stream = stream is True
        self._body = stream if isinstance(stream, bytes) else b""
        self._loop = loop
        self._total: tuple[float, str] | None = None
        self.status = status
        self.headers: Sequence[tuple[bytes, bytes]] = _SSE if self._stream else _JSON

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)

    def expire_in(
        self, delay_s: float, message: str, idle_s: float | None = None, idle_message: str = ""
    ) -> None:
        self._total = (self._loop.time() + delay_s, message)

    def pause_reading(self) -> None:
        pass  # the simulator's clients keep up

    def resume_reading(self) -> None:
        pass

    async def _ended(self) -> float:
        """The answer's end, or its total deadline's UpstreamTimeout."""
        flight = self._flight
        assert flight is not None
        timer = None
        if self._total is not None and not flight.end.done():
            at, message = self._total
            if math.isfinite(at):
                timer = self._loop.call_at(at - self._hop, _fail, flight.end, message, "total")
        try:
            ended = await flight.end
            if self._hop:  # the last chunk on its way
                await asyncio.sleep(self._hop)
            return ended
        except BaseException:
            self._backend.abort(flight)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    async def read(self) -> bytes:
        if self._flight is None:
            return self._body
        await self._ended()
        return _whole(self._flight.job)

    async def relay(self, sink: RelaySink) -> None:
        flight = self._flight
        assert flight is not None
        sink.pending.append(_FIRST)
        sink.flush()
        try:
            await self._ended()
        except ReadError:  # it died: what it had streamed since its first token came first
            if flight.said > 1:
                sink.pending.append(_tokens(flight.said - 1))
                sink.flush()
            raise
        sink.pending.append(_rest(flight.job))
        sink.flush()


def _usage(job: Job) -> bytes:
    p, n = job.prompt_tokens, job.output_tokens
    return b'"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (p, n, p + n)


def _rest(job: Job) -> bytes:
    """A stream's chunks after its first: the rest of the text, its end and usage, [DONE]."""
    text = _TEXT * (job.output_tokens - 1)
    return (
        b'data: {"id":"sim","object":"chat.completion.chunk","created":0,"model":"sim",'
        b'"choices":[{"index":0,"delta":{"content":"' + text + b'"},"finish_reason":"length"}],'
        + _usage(job) + b"}\n\ndata: [DONE]\n\n"
    )  # fmt: skip


def _tokens(count: int) -> bytes:
    """A stream chunk of `count` tokens of text."""
    return (
        b'data: {"id":"sim","object":"chat.completion.chunk","created":0,"model":"sim",'
        b'"choices":[{"index":0,"delta":{"content":"' + _TEXT * count
        + b'"},"finish_reason":null}]}\n\n'
    )  # fmt: skip


def _whole(job: Job) -> bytes:
    return (
        b'{"id":"sim","object":"chat.completion","created":0,"model":"sim","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"' + _TEXT * job.output_tokens
        + b'"},"finish_reason":"length"}],' + _usage(job) + b"}"
    )  # fmt: skip
