"""The OpenAI-compatible wire format as the load generator speaks it: bodies out, chunks in.

Requests ask for `ignore_eos` so a server generates exactly max_tokens (vLLM and SGLang honour
it; others ignore it), and, when streaming, for a final usage chunk so the output length comes
from the server rather than from counting deltas.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from fleetgate.bench.workloads import Endpoint, RequestSpec

PATHS: dict[Endpoint, bytes] = {
    "chat": b"/v1/chat/completions",
    "completions": b"/v1/completions",
}

_encoder = msgspec.json.Encoder()


def encode_request(spec: RequestSpec, *, model: str, stream: bool) -> bytes:
    """The JSON body for `spec` on its endpoint."""
    body: dict[str, object] = {"model": model}
    if spec.endpoint == "chat":
        body["messages"] = [{"role": m.role, "content": m.content} for m in spec.messages]
    else:
        body["prompt"] = spec.prompt
    body["max_tokens"] = spec.max_tokens
    body["ignore_eos"] = True
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    return _encoder.encode(body)


class _Message(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None  # vLLM's and SGLang's reasoning parsers use this


class _Choice(msgspec.Struct):
    delta: _Message | None = None  # chat, streamed
    message: _Message | None = None  # chat, whole
    text: str | None = None  # completions


class _Usage(msgspec.Struct):
    completion_tokens: int | None = None


class _Error(msgspec.Struct):
    message: str = ""


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: _Error | None = None


_decoder = msgspec.json.Decoder(_Chunk)


@dataclass(frozen=True, slots=True)
class ChunkContent:
    """What one streamed chunk (or a whole non-streamed body) carries for the benchmark."""

    text: str  # generated text in it, reasoning included; "" when none
    completion_tokens: int | None  # from `usage`, where the chunk has it
    error: str | None  # the message of an in-band error object


def parse_chunk(data: bytes) -> ChunkContent:
    """Read a chunk's text, usage and error. Raises msgspec.DecodeError on malformed JSON."""
    chunk = _decoder.decode(data)
    text = ""
    for choice in chunk.choices:
        message = choice.delta or choice.message
        if message is not None:
            if message.content:
                text += message.content
            if message.reasoning_content:
                text += message.reasoning_content
        elif choice.text:
            text += choice.text
    tokens = chunk.usage.completion_tokens if chunk.usage is not None else None
    error = (chunk.error.message or "error") if chunk.error is not None else None
    return ChunkContent(text, tokens, error)
