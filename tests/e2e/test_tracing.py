"""OpenTelemetry tracing on a started gateway (in-process, real sockets): spans exported over
OTLP/HTTP to a receiver in the test that decodes the real protobuf payloads; a client's W3C
traceparent continued and each attempt's own passed to the backend; head sampling."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from fleetgate.config import parse_config
from fleetgate.running import start_gateway
from tests.gateway.recording import Recorder

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


class Receiver:
    """An OTLP/HTTP traces endpoint: decodes each export's protobuf and keeps its spans."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.content_types: set[str] = set()
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
                body = await reader.readexactly(int(headers["content-length"]))
                assert lines[0].startswith("POST /v1/traces ")
                self.content_types.add(headers["content-type"])
                export = ExportTraceServiceRequest.FromString(body)
                for resource in export.resource_spans:
                    for scope in resource.scope_spans:
                        self.spans.extend(scope.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\n"
                             b"content-length: %d\r\n\r\n%b" % (len(answer), answer))  # fmt: skip
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def attributes(span: Span) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def gateway_config(receiver: Receiver, recorder: Recorder, log: Path, sample: float) -> Any:
    return parse_config({
        "server": {"port": 0},
        "request_log": {"path": str(log)},
        "tracing": {"enabled": True, "sample": sample,
                    "endpoint": f"http://127.0.0.1:{receiver.port}/v1/traces"},
        "pools": [
            {"model": "rec", "backends": [{"url": f"http://127.0.0.1:{recorder.port}"}],
             "health_check": {"enabled": False}, "engine_metrics": {"enabled": False},
             "pricing": {"input_per_1m_usd": 1.0, "output_per_1m_usd": 1.0}},
            {"model": "m", "backends": [{"sim": "h100-llama3-8b"}]},
        ],
    })  # fmt: skip


async def servers() -> tuple[Receiver, Recorder, list[asyncio.Server]]:
    receiver, recorder = Receiver(), Recorder()
    otlp = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    upstream = await asyncio.start_server(recorder.handle, "127.0.0.1", 0)
    receiver.port = otlp.sockets[0].getsockname()[1]
    recorder.port = upstream.sockets[0].getsockname()[1]
    return receiver, recorder, [otlp, upstream]


async def test_spans_continue_the_clients_trace_and_each_attempt_reaches_the_backend(
    tmp_path: Path,
) -> None:
    receiver, recorder, listening = await servers()
    log = tmp_path / "requests.jsonl"
    running = await start_gateway(gateway_config(receiver, recorder, log, 1.0))
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{running.port}/v1", api_key="x", max_retries=0
    )
    hi = [{"role": "user", "content": "hi"}]
    try:
        await client.chat.completions.create(
            model="rec", messages=hi, max_tokens=5,  # type: ignore[arg-type]
            extra_headers={"traceparent": f"00-{TRACE}-{PARENT}-01"},
        )  # fmt: skip
        stream = await client.chat.completions.create(
            model="m",
            messages=hi,
            max_tokens=4,
            stream=True,  # type: ignore[arg-type]
        )
        async for _ in stream:
            pass
        # Not sampled by the client: no span, and its traceparent goes on as it came.
        unsampled = f"00-{'1' * 32}-{'2' * 16}-00"
        await client.chat.completions.create(
            model="rec", messages=hi,  # type: ignore[arg-type]
            extra_headers={"traceparent": unsampled},
        )  # fmt: skip
        await client.chat.completions.create(  # malformed: a new trace, not a failure
            model="rec", messages=hi,  # type: ignore[arg-type]
            extra_headers={"traceparent": "00-zz-bad"},
        )  # fmt: skip
    finally:
        await client.close()
        await running.close()  # exports the spans still waiting
        for server in listening:
            server.close()

    assert receiver.content_types == {"application/x-protobuf"}
    spans = receiver.spans
    by_id = {span.span_id: span for span in spans}
    traces = {span.trace_id.hex() for span in spans}
    assert TRACE in traces and "1" * 32 not in traces
    assert len(traces) == 3  # the client's, the stream's and the malformed one's new trace

    # The client's trace: the request span under the client's span, its attempt under it.
    (request,) = [s for s in spans if s.trace_id.hex() == TRACE and s.kind == Span.SPAN_KIND_SERVER]
    assert request.parent_span_id.hex() == PARENT
    assert request.name == "chat rec"
    attrs = attributes(request)
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "rec"
    assert attrs["gen_ai.request.max_tokens"] == 5
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (7, 5)
    assert attrs["http.response.status_code"] == 200
    children = [s for s in spans if s.parent_span_id == request.span_id]
    assert sorted(s.name for s in children) == ["admission", "attempt first", "route first"]
    (attempt,) = [s for s in children if s.name == "attempt first"]
    assert attempt.kind == Span.SPAN_KIND_CLIENT
    assert attributes(attempt)["server.port"] == recorder.port
    assert request.start_time_unix_nano <= attempt.start_time_unix_nano
    assert attempt.end_time_unix_nano <= request.end_time_unix_nano
    # The backend got the attempt's own context, in the client's trace.
    first, second, third = (h.get("traceparent") for h in recorder.heads)
    assert first == f"00-{TRACE}-{attempt.span_id.hex()}-01"
    assert second == unsampled
    assert third is not None and third.startswith("00-") and "zz" not in third

    # The stream: a new trace with a stream span under its attempt, and its TTFT.
    (streamed,) = [s for s in spans if s.name == "chat m"]
    assert attributes(streamed)["gen_ai.server.time_to_first_token"] > 0
    (stream_span,) = [s for s in spans if s.name == "stream"]
    assert by_id[stream_span.parent_span_id].name == "attempt first"
    assert by_id[stream_span.parent_span_id].parent_span_id == streamed.span_id
    assert attributes(stream_span)["fleetgate.stream.output_tokens"] >= 1

    # The request log names the trace of each sampled request.
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines[0]["trace_id"] == TRACE
    assert lines[1]["trace_id"] == streamed.trace_id.hex()
    assert "trace_id" not in lines[2]


async def test_head_sampling_keeps_about_its_share_of_new_traces(tmp_path: Path) -> None:
    receiver, recorder, listening = await servers()
    running = await start_gateway(gateway_config(receiver, recorder, tmp_path / "l", 0.25))
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{running.port}/v1", api_key="x", max_retries=0
    )
    try:
        for _ in range(200):
            await client.chat.completions.create(
                model="rec",
                messages=[{"role": "user", "content": "hi"}],  # type: ignore[list-item]
            )
    finally:
        await client.close()
        await running.close()
        for server in listening:
            server.close()
    kept = {s.trace_id for s in receiver.spans}
    assert 25 <= len(kept) <= 75  # 50 expected (binomial: 6 standard deviations apart)
    traced = sum("traceparent" in h for h in recorder.heads)
    assert traced == len(kept)  # only a sampled request's attempt carries a traceparent
