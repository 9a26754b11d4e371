"""OpenTelemetry tracing from the request lifecycle's events (`tracing:`, off by default): a
span per request and, under it, the admission wait, each routing decision (the plugins'
scores as attributes), each upstream attempt and its stream, with the GenAI semantic
conventions' attributes; exported over OTLP/HTTP in batches from the SDK's own thread.

    <operation> <model>     SERVER   Received .. Finished (with its token counts)
      admission             INTERNAL arrival .. Admitted
      route <kind>          INTERNAL at Routed (backend, fleetgate.routing.score.<plugin>)
      attempt <kind>        CLIENT   AttemptStarted .. AttemptEnded
        stream              INTERNAL FirstToken .. AttemptEnded (streamed answers)

A client's W3C `traceparent` is continued (its trace, its sampling decision); otherwise a
trace is kept with probability `sample` (head sampling, decided here with the injected random
source: an unsampled request makes no span and costs a dictionary look-up per event). Each
attempt's request carries its own span's `traceparent` to the backend (`headers_for`, called
by upstream/attempt.py), so an engine that traces (vLLM's --otlp-traces-endpoint) continues
the same trace. Off, nothing here is imported or subscribed: the request path pays nothing.

A sampled request's spans are recorded as plain values while it runs and handed, finished,
to the SDK's export pipeline (its ReadableSpan, BatchSpanProcessor and OTLP exporter) when
it ends: the SDK's live Span objects cost about 20 us each to start and end (attribute
checks, locks, the context API), five times the gateway's own work per request.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetgate.lifecycle.events import (
    Admitted,
    AttemptEnded,
    AttemptStarted,
    Finished,
    FirstToken,
    Received,
    Routed,
)
from fleetgate.lifecycle.hooks import Hooks
from fleetgate.settings import Settings, positive_seconds, within

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
    from opentelemetry.trace import SpanContext

_TRACEPARENT = re.compile(rb"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_MAX_OPEN = 65_536  # sampled requests in flight traced at most
_OPERATIONS = {
    b"/v1/chat/completions": "chat",
    b"/v1/completions": "text_completion",
    b"/v1/embeddings": "embeddings",
}


class TracingSettings(Settings, frozen=True):
    """The `tracing:` section."""

    enabled: bool = False
    endpoint: str = "http://127.0.0.1:4318/v1/traces"  # an OTLP/HTTP collector's traces URL
    sample: float = 0.1  # share of new traces kept
    # A client's sampled traceparent is traced whatever `sample` says; false: `sample` decides
    # for every request (the client's trace is still continued when it is drawn), so no
    # client can make the gateway trace all its requests.
    follow_client_sampling: bool = True
    service_name: str = "fleetgate"
    headers: dict[str, str] = {}  # sent to the collector with each export (e.g. its auth)
    export_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        within("sample", self.sample, 0, 1)
        positive_seconds("export_timeout_s", self.export_timeout_s)
        if not self.endpoint.startswith(("http://", "https://")):
            raise ValueError("`endpoint` must be an http(s) URL of an OTLP/HTTP traces receiver")


@dataclass(slots=True)
class _Recorded:
    """A span while its request runs: what the SDK's ReadableSpan is made of at the end."""

    name: str
    span_id: int
    parent_id: int  # 0: the request span (its parent is the client's, or none)
    start: float  # the events' clock
    kind: int  # 0 internal, 1 server, 2 client (opentelemetry.trace.SpanKind's values)
    attributes: dict[str, Any]
    end: float | None = None
    error: bool = False


@dataclass(slots=True)
class _Open:
    """One sampled request's spans: its own first."""

    trace_id: int
    remote: SpanContext | None  # the client's span, when it sent a traceparent
    spans: list[_Recorded]
    attempts: dict[str, _Recorded] = field(default_factory=dict)  # open, by backend id
    streams: dict[str, _Recorded] = field(default_factory=dict)

    @property
    def request(self) -> _Recorded:
        return self.spans[0]


class Tracing:
    """Spans from events, exported through `processor` (the SDK's BatchSpanProcessor over an
    OTLP exporter, made by `start_tracing`); `wall_offset` turns the events' clock into Unix
    time; `rng` draws the sampling decisions and the trace and span ids."""

    def __init__(
        self,
        processor: SpanProcessor,
        resource: Any,
        wall_offset: float,
        sample: float,
        rng: random.Random,
        schedule: Callable[[Callable[[], None]], object] | None = None,
        follow_client_sampling: bool = True,
    ) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        self._processor = processor
        self._resource = resource
        self._offset = wall_offset
        self._sample = sample
        self._follow = follow_client_sampling
        self._rng = rng
        self._schedule = schedule or _call_soon
        self._open: dict[bytes, _Open] = {}
        self._readable = ReadableSpan
        self._context = SpanContext
        self._sampled = TraceFlags(TraceFlags.SAMPLED)
        self._kinds = (SpanKind.INTERNAL, SpanKind.SERVER, SpanKind.CLIENT)
        self._error, self._unset = Status(StatusCode.ERROR), Status(StatusCode.UNSET)
        self._scope = InstrumentationScope("fleetgate")

    def subscribe(self, hooks: Hooks) -> None:
        hooks.subscribe(Received, self.on_received)
        hooks.subscribe(Admitted, self.on_admitted)
        hooks.subscribe(Routed, self.on_routed)
        hooks.subscribe(AttemptStarted, self.on_attempt_started)
        hooks.subscribe(FirstToken, self.on_first_token)
        hooks.subscribe(AttemptEnded, self.on_attempt_ended)
        hooks.subscribe(Finished, self.on_finished)

    def _child(
        self, known: _Open, name: str, at: float, parent: _Recorded | None = None,
        kind: int = 0, attributes: dict[str, Any] | None = None,
    ) -> _Recorded:  # fmt: skip
        span = _Recorded(name, self._rng.getrandbits(64) or 1,
                         (parent or known.request).span_id, at, kind, attributes or {})  # fmt: skip
        known.spans.append(span)
        return span

    def on_received(self, event: Received) -> None:
        # Head sampling before anything else: an unsampled request (most of them) costs one
        # random draw.
        if len(self._open) >= _MAX_OPEN:
            return  # bounded, whatever happens to requests in flight
        remote = _remote_parent(event.traceparent)
        if remote is None or not self._follow:
            if self._rng.random() >= self._sample:
                return
            new = self._rng.getrandbits(128) or 1
            trace_id = new if remote is None else remote.trace_id
        elif remote.trace_flags & 1:
            trace_id = remote.trace_id
        else:
            return  # the client's trace is not sampled
        operation = _OPERATIONS.get(event.path, "request")
        request = _Recorded(operation, self._rng.getrandbits(64) or 1, 0, event.at, 1, {
            "gen_ai.operation.name": operation, "http.request.method": "POST",
            "url.path": event.path.decode("latin-1"),
            "fleetgate.request_id": event.request_id.decode("latin-1"),
        })  # fmt: skip
        self._open[event.request_id] = _Open(trace_id, remote, [request])

    def on_admitted(self, event: Admitted) -> None:
        known = self._open.get(event.request_id)
        if known is None:
            return
        request, span = event.request, known.request
        span.name = f"{span.name} {event.model}"
        span.attributes.update({
            "gen_ai.request.model": event.model, "fleetgate.tenant": event.tenant,
            "fleetgate.priority": event.priority, "fleetgate.stream": request.stream,
        })  # fmt: skip
        if request.max_tokens is not None:
            span.attributes["gen_ai.request.max_tokens"] = request.max_tokens
        wait = self._child(known, "admission", event.at - event.queued_s,
                           attributes={"fleetgate.queued_s": event.queued_s})  # fmt: skip
        wait.end = event.at

    def on_routed(self, event: Routed) -> None:
        known = self._open.get(event.request_id)
        if known is None:
            return
        attributes: dict[str, Any] = {
            f"fleetgate.routing.score.{plugin}": score for plugin, score in event.scores.items()
        }
        if event.backend is not None:
            attributes["fleetgate.backend"] = event.backend
        span = self._child(known, f"route {event.kind}", event.at, attributes=attributes)
        span.end = event.at

    def on_attempt_started(self, event: AttemptStarted) -> None:
        known = self._open.get(event.request_id)
        if known is None:
            return
        backend = event.backend
        host, _, port = backend.rpartition(":")
        known.attempts[backend] = self._child(
            known, f"attempt {event.kind}", event.at, kind=2,
            attributes={"server.address": host, "server.port": int(port) if port.isdigit() else 0,
                        "fleetgate.backend": backend, "fleetgate.attempt.kind": event.kind,
                        "fleetgate.prompt_tokens_estimated": event.prompt_tokens,
                        "fleetgate.queued_prefill_tokens": event.queued_prefill},
        )  # fmt: skip

    def on_first_token(self, event: FirstToken) -> None:
        known = self._open.get(event.request_id)
        if known is None:
            return
        backend = event.backend
        attempt = known.attempts.get(backend)
        if attempt is None:
            return
        attempt.attributes["fleetgate.attempt.time_to_first_token_s"] = event.at - event.sent_at
        known.streams[backend] = self._child(known, "stream", event.at, attempt)
        if event.ttft_s is not None:
            known.request.attributes["gen_ai.server.time_to_first_token"] = event.ttft_s

    def on_attempt_ended(self, event: AttemptEnded) -> None:
        known = self._open.get(event.request_id)
        if known is None:
            return
        backend = event.backend
        stream = known.streams.pop(backend, None)
        if stream is not None:
            stream.attributes["fleetgate.stream.output_tokens"] = event.output_tokens
            stream.end = event.at
        attempt = known.attempts.pop(backend, None)
        if attempt is None:
            return
        if event.status:
            attempt.attributes["http.response.status_code"] = event.status
        if event.error is not None:
            attempt.attributes["error.type"] = event.error
            attempt.error = True
        elif event.status >= 500:
            attempt.attributes["error.type"] = str(event.status)
            attempt.error = True
        attempt.end = event.at

    def on_finished(self, event: Finished) -> None:
        known = self._open.get(event.request_id)
        if known is None:
            return
        span = known.request
        span.attributes["http.response.status_code"] = event.status
        span.attributes["fleetgate.outcome"] = event.outcome
        if event.model:
            span.attributes["gen_ai.request.model"] = event.model
        if event.backend != "none":
            span.attributes["fleetgate.backend"] = event.backend
        if event.status >= 500:
            span.attributes["error.type"] = str(event.status)
            span.error = True
        if event.prompt_tokens is not None:
            span.attributes["gen_ai.usage.input_tokens"] = event.prompt_tokens
            span.attributes["gen_ai.usage.output_tokens"] = event.completion_tokens
            span.attributes["fleetgate.cost_usd"] = event.cost_usd
        span.end = event.at
        # Exported after this step: an attempt it cut short ends in it.
        self._schedule(lambda: self._export(event.request_id))

    def _export(self, request_id: bytes) -> None:
        known = self._open.pop(request_id, None)
        if known is None:
            return
        end = known.request.end
        assert end is not None
        on_end = self._processor.on_end
        for span in known.spans:
            on_end(self._made(known, span, end))

    def _made(self, known: _Open, span: _Recorded, request_end: float) -> ReadableSpan:
        """The SDK's finished span; one still open (an attempt the client's leaving cut
        short) ends with its request."""
        trace_id, context = known.trace_id, self._context
        parent = (
            known.remote if span.parent_id == 0
            else context(trace_id, span.parent_id, False, self._sampled)
        )  # fmt: skip
        end = span.end if span.end is not None else request_end
        return self._readable(
            span.name, context(trace_id, span.span_id, False, self._sampled), parent,
            self._resource, span.attributes, kind=self._kinds[span.kind],
            status=self._error if span.error else self._unset,
            start_time=int((span.start + self._offset) * 1e9),
            end_time=int((end + self._offset) * 1e9), instrumentation_scope=self._scope,
        )  # fmt: skip

    def headers_for(self, request_id: bytes, backend_id: str) -> bytes | None:
        """The `traceparent` for an attempt's request to `backend_id` (None: not traced)."""
        known = self._open.get(request_id)
        if known is None:
            return None
        span = known.attempts.get(backend_id)
        if span is None:
            return None
        return b"00-%032x-%016x-01" % (known.trace_id, span.span_id)

    def trace_id(self, request_id: bytes) -> str | None:
        """The request's trace id, while it is open and sampled (for the request log)."""
        known = self._open.get(request_id)
        return None if known is None else f"{known.trace_id:032x}"

    @property
    def open_requests(self) -> int:
        return len(self._open)

    async def close(self) -> None:
        """Export what is left (the SDK's shutdown blocks: in a thread)."""
        await asyncio.to_thread(self._processor.shutdown)


def _remote_parent(traceparent: bytes | None) -> SpanContext | None:
    """The client's span from its `traceparent` (None: none, or malformed: a new trace; W3C
    asks never to fail a request over it)."""
    if traceparent is None:
        return None
    match = _TRACEPARENT.match(traceparent.strip().lower())
    if match is None:
        return None
    trace_id, span_id = int(match.group(1), 16), int(match.group(2), 16)
    if trace_id == 0 or span_id == 0:
        return None
    from opentelemetry.trace import SpanContext, TraceFlags

    flags = TraceFlags(int(match.group(3), 16) & 1)
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)


def _call_soon(callback: Callable[[], None]) -> object:
    return asyncio.get_running_loop().call_soon(callback)


def start_tracing(
    settings: TracingSettings,
    wall_offset: float,
    rng: random.Random,
    extra: Mapping[str, str] | None = None,
) -> Tracing:
    """Tracing that exports to `settings.endpoint` over OTLP/HTTP (protobuf), sampling new
    traces at `settings.sample` and following a client's decision."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": settings.service_name, **(extra or {})})
    exporter = OTLPSpanExporter(
        endpoint=settings.endpoint, headers=dict(settings.headers),
        timeout=settings.export_timeout_s,
    )  # fmt: skip
    processor = BatchSpanProcessor(exporter, schedule_delay_millis=1000)
    return Tracing(processor, resource, wall_offset, settings.sample, rng,
                   follow_client_sampling=settings.follow_client_sampling)  # fmt: skip
