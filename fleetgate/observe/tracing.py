"""OpenTelemetry tracing from the request lifecycle's events (`tracing:`, off by default): a
span per request and, under it, the admission wait, each routing decision (the plugins'
scores as attributes), each upstream attempt and its stream, with the GenAI semantic
conventions' attributes; exported over OTLP/HTTP in batches from the SDK's own thread.

    <operation> <model>     SERVER   Received .. Finished (+ Charged's token counts)
      admission             INTERNAL arrival .. Admitted
      route <kind>          INTERNAL at Routed (backend, fleetgate.routing.score.<plugin>)
      attempt <kind>        CLIENT   AttemptStarted .. AttemptEnded
        stream              INTERNAL FirstToken .. AttemptEnded (streamed answers)

A client's W3C `traceparent` is continued (its trace, its sampling decision); otherwise a
trace is kept with probability `sample` (head sampling: an unsampled request makes no span
and costs a dictionary look-up per event). Each attempt's request carries its own span's
`traceparent` to the backend (`headers_for`, called by upstream/attempt.py), so an engine that
traces (vLLM's --otlp-traces-endpoint) continues the same trace. Off, nothing here is imported
or subscribed: the request path pays nothing.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetgate.lifecycle.events import (
    Admitted,
    AttemptEnded,
    AttemptStarted,
    Charged,
    Finished,
    FirstToken,
    Received,
    Routed,
)
from fleetgate.lifecycle.hooks import Hooks
from fleetgate.settings import Settings, positive_seconds, within

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

_TRACEPARENT = re.compile(rb"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_OPERATIONS = {
    b"/v1/chat/completions": "chat",
    b"/v1/completions": "text_completion",
    b"/v1/embeddings": "embeddings",
}


class TracingSettings(Settings, frozen=True):
    """The `tracing:` section."""

    enabled: bool = False
    endpoint: str = "http://127.0.0.1:4318/v1/traces"  # an OTLP/HTTP collector's traces URL
    sample: float = 0.1  # share of new traces kept (a client's sampled traceparent is kept)
    service_name: str = "fleetgate"
    headers: dict[str, str] = {}  # sent to the collector with each export (e.g. its auth)
    export_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        within("sample", self.sample, 0, 1)
        positive_seconds("export_timeout_s", self.export_timeout_s)
        if not self.endpoint.startswith(("http://", "https://")):
            raise ValueError("`endpoint` must be an http(s) URL of an OTLP/HTTP traces receiver")


@dataclass(slots=True)
class _Open:
    """One sampled request's spans still open."""

    request: Span
    attempts: dict[str, Span] = field(default_factory=dict)  # by backend id
    streams: dict[str, Span] = field(default_factory=dict)
    finished: bool = False


class Tracing:
    """Spans from events; `provider` exports them (the SDK's TracerProvider, made by
    `start_tracing`); `wall_offset` turns the events' clock into Unix time."""

    def __init__(
        self,
        provider: TracerProvider,
        wall_offset: float,
        schedule: Callable[[Callable[[], None]], object] | None = None,
    ) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        self._provider = provider
        self._tracer: Tracer = provider.get_tracer("fleetgate")
        self._offset = wall_offset
        self._schedule = schedule or _call_soon
        self._open: dict[bytes, _Open] = {}
        self._kinds = SpanKind
        self._error = Status(StatusCode.ERROR)
        self._within = set_span_in_context

    def subscribe(self, hooks: Hooks) -> None:
        hooks.subscribe(Received, self.on_received)
        hooks.subscribe(Admitted, self.on_admitted)
        hooks.subscribe(Routed, self.on_routed)
        hooks.subscribe(AttemptStarted, self.on_attempt_started)
        hooks.subscribe(FirstToken, self.on_first_token)
        hooks.subscribe(AttemptEnded, self.on_attempt_ended)
        hooks.subscribe(Finished, self.on_finished)
        hooks.subscribe(Charged, self.on_charged)

    def _ns(self, at: float) -> int:
        return int((at + self._offset) * 1e9)

    def on_received(self, event: Received) -> None:
        operation = _OPERATIONS.get(event.path, "request")
        span = self._tracer.start_span(
            operation, context=_remote_parent(event.traceparent), kind=self._kinds.SERVER,
            start_time=self._ns(event.at),
            attributes={"gen_ai.operation.name": operation, "http.request.method": "POST",
                        "url.path": event.path.decode("latin-1"),
                        "fleetgate.request_id": event.request_id.decode("latin-1")},
        )  # fmt: skip
        if span.is_recording():
            self._open[event.request_id] = _Open(span)

    def on_admitted(self, event: Admitted) -> None:
        known = self._open.get(event.request_id)
        if known is None:
            return
        request, span = event.request, known.request
        span.update_name(f"{span_operation(span)} {event.model}")
        span.set_attributes({
            "gen_ai.request.model": event.model, "fleetgate.tenant": event.tenant,
            "fleetgate.priority": event.priority, "fleetgate.stream": request.stream,
        })  # fmt: skip
        if request.max_tokens is not None:
            span.set_attribute("gen_ai.request.max_tokens", request.max_tokens)
        wait = self._tracer.start_span(
            "admission", context=self._within(span),
            start_time=self._ns(event.at - event.queued_s),
            attributes={"fleetgate.queued_s": event.queued_s},
        )  # fmt: skip
        wait.end(end_time=self._ns(event.at))

    def on_routed(self, event: Routed) -> None:
        known = self._open.get(event.request_id)
        if known is None:
            return
        attributes: dict[str, Any] = {
            f"fleetgate.routing.score.{plugin}": score for plugin, score in event.scores.items()
        }
        if event.backend is not None:
            attributes["fleetgate.backend"] = event.backend.backend.id
        span = self._tracer.start_span(
            f"route {event.kind}", context=self._within(known.request),
            start_time=self._ns(event.at), attributes=attributes,
        )  # fmt: skip
        span.end(end_time=self._ns(event.at))

    def on_attempt_started(self, event: AttemptStarted) -> None:
        known = self._open.get(event.request_id)
        if known is None:
            return
        backend = event.backend.backend
        host, _, port = backend.id.rpartition(":")
        span = self._tracer.start_span(
            f"attempt {event.kind}", context=self._within(known.request),
            kind=self._kinds.CLIENT, start_time=self._ns(event.at),
            attributes={"server.address": host, "server.port": int(port) if port.isdigit() else 0,
                        "fleetgate.backend": backend.id, "fleetgate.attempt.kind": event.kind,
                        "fleetgate.prompt_tokens_estimated": event.prompt_tokens,
                        "fleetgate.queued_prefill_tokens": event.queued_prefill},
        )  # fmt: skip
        known.attempts[backend.id] = span

    def on_first_token(self, event: FirstToken) -> None:
        known = self._open.get(event.request_id)
        if known is None:
            return
        backend = event.backend.backend.id
        attempt = known.attempts.get(backend)
        if attempt is None:
            return
        attempt.set_attribute("fleetgate.attempt.time_to_first_token_s", event.at - event.sent_at)
        known.streams[backend] = self._tracer.start_span(
            "stream", context=self._within(attempt), start_time=self._ns(event.at)
        )
        if event.ttft_s is not None:
            known.request.set_attribute("gen_ai.server.time_to_first_token", event.ttft_s)

    def on_attempt_ended(self, event: AttemptEnded) -> None:
        known = self._open.get(event.request_id)
        if known is None:
            return
        backend = event.backend.backend.id
        end = self._ns(event.at)
        stream = known.streams.pop(backend, None)
        if stream is not None:
            stream.set_attribute("fleetgate.stream.events", event.events)
            stream.end(end_time=end)
        attempt = known.attempts.pop(backend, None)
        if attempt is None:
            return
        if event.status:
            attempt.set_attribute("http.response.status_code", event.status)
        if event.error is not None:
            attempt.set_attribute("error.type", event.error)
            attempt.set_status(self._error)
        elif event.status >= 500:
            attempt.set_attribute("error.type", str(event.status))
            attempt.set_status(self._error)
        attempt.end(end_time=end)

    def on_finished(self, event: Finished) -> None:
        known = self._open.get(event.request_id)
        if known is None:
            return
        span = known.request
        span.set_attributes({"http.response.status_code": event.status,
                             "fleetgate.outcome": event.outcome})  # fmt: skip
        if event.model:
            span.set_attribute("gen_ai.request.model", event.model)
        if event.backend != "none":
            span.set_attribute("fleetgate.backend", event.backend)
        if event.status >= 500:
            span.set_attribute("error.type", str(event.status))
            span.set_status(self._error)
        known.finished = True
        end = self._ns(event.at)
        # Charged, when the request's use is counted, comes right after in the same step.
        self._schedule(lambda: self._end(event.request_id, end))

    def on_charged(self, event: Charged) -> None:
        known = self._open.get(event.request_id)
        if known is not None:
            known.request.set_attributes({
                "gen_ai.usage.input_tokens": event.prompt_tokens,
                "gen_ai.usage.output_tokens": event.completion_tokens,
                "fleetgate.cost_usd": event.cost_usd,
            })  # fmt: skip

    def _end(self, request_id: bytes, end: int) -> None:
        known = self._open.pop(request_id, None)
        if known is None:
            return
        for span in (*known.streams.values(), *known.attempts.values()):
            span.end(end_time=end)  # an attempt the client's leaving cut short
        known.request.end(end_time=end)

    def headers_for(self, request_id: bytes, backend_id: str) -> bytes | None:
        """The `traceparent` for an attempt's request to `backend_id` (None: not traced)."""
        known = self._open.get(request_id)
        if known is None:
            return None
        span = known.attempts.get(backend_id)
        if span is None:
            return None
        context = span.get_span_context()
        return b"00-%032x-%016x-%02x" % (context.trace_id, context.span_id, context.trace_flags)

    def trace_id(self, request_id: bytes) -> str | None:
        """The request's trace id, while it is open and sampled (for the request log)."""
        known = self._open.get(request_id)
        if known is None:
            return None
        return f"{known.request.get_span_context().trace_id:032x}"

    @property
    def open_requests(self) -> int:
        return len(self._open)

    async def close(self) -> None:
        """Export what is left (the SDK's shutdown blocks: in a thread)."""
        await asyncio.to_thread(self._provider.shutdown)


def span_operation(span: Any) -> str:
    """The operation a request span was named after."""
    name: str = getattr(span, "name", "request")
    return name.split(" ", 1)[0]


def _remote_parent(traceparent: bytes | None) -> Any:
    """The client's trace as the request span's parent context (None: a new trace)."""
    if traceparent is None:
        return None
    match = _TRACEPARENT.match(traceparent.strip().lower())
    if match is None:
        return None  # malformed: start a new trace (W3C: never fail the request over it)
    trace_id, span_id = int(match.group(1), 16), int(match.group(2), 16)
    if trace_id == 0 or span_id == 0:
        return None
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

    context = SpanContext(trace_id, span_id, is_remote=True,
                          trace_flags=TraceFlags(int(match.group(3), 16) & 1))  # fmt: skip
    return set_span_in_context(NonRecordingSpan(context))


def _call_soon(callback: Callable[[], None]) -> object:
    return asyncio.get_running_loop().call_soon(callback)


def start_tracing(
    settings: TracingSettings, wall_offset: float, extra: Mapping[str, str] | None = None
) -> Tracing:
    """Tracing that exports to `settings.endpoint` over OTLP/HTTP (protobuf), sampling new
    traces at `settings.sample` and following a client's decision."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    resource = Resource.create({"service.name": settings.service_name, **(extra or {})})
    provider = TracerProvider(
        resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample))
    )
    exporter = OTLPSpanExporter(
        endpoint=settings.endpoint, headers=dict(settings.headers),
        timeout=settings.export_timeout_s,
    )  # fmt: skip
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1000))
    return Tracing(provider, wall_offset)
