"""What the gateway and the built-in workers both speak of OpenAI's HTTP API: the error shape
{"error": {"message", "type", "param", "code"}}, as a body and as a stream's last event, and
the framing of a Server-Sent-Events stream."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from fleetgate.lifecycle.downstream import Downstream


class _Detail(msgspec.Struct, omit_defaults=False):
    message: str
    type: str
    param: str | None
    code: str | None


class _Body(msgspec.Struct):
    error: _Detail


_encode = msgspec.json.Encoder().encode

JSON = b"application/json"
# The head of every streamed answer.
SSE_HEADERS = ((b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"))
DONE = b"[DONE]"  # the payload of a stream's last event
DONE_EVENT = b"data: [DONE]\n\n"

# The `type` OpenAI uses for each status family.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "invalid_request_error" if status < 500 else "server_error"


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> bytes:
    """The JSON bytes of an OpenAI-shaped error."""
    return _encode(_Body(_Detail(message, error_type(status), param, code)))


def send_error(
    writer: Downstream,
    status: int,
    message: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """The server's fallback for errors outside any handler (bad HTTP, a handler crash)."""
    writer.send(status, [(b"content-type", JSON), *headers], error_body(status, message))


def error_event(status: int, message: str, code: str | None = None) -> bytes:
    """The same error as one Server-Sent Event, for a stream that cannot go on."""
    return b"data: " + error_body(status, message, None, code) + b"\n\n"


def response_error_event(message: str, code: str, sequence_number: int) -> bytes:
    """A Responses API stream's `error` event (its streams are typed events, with no
    [DONE]), for one that cannot go on."""
    data = {"type": "error", "code": code, "message": message, "param": None,
            "sequence_number": sequence_number}  # fmt: skip
    return b"event: error\ndata: " + _encode(data) + b"\n\n"


_top_level = msgspec.json.Decoder(dict[str, msgspec.Raw])


def with_fields(body: bytes, drop: tuple[str, ...] = (), **fields: object) -> bytes:
    """A request body (a JSON object) with top-level `fields` set and `drop` removed; every
    other field passes through as the client wrote it (only the top level is decoded)."""
    top = _top_level.decode(body)
    for name in drop:
        top.pop(name, None)
    for name, value in fields.items():
        top[name] = msgspec.Raw(_encode(value))
    return _encode(top)


class Usage(msgspec.Struct, gc=False):  # ints only: never in a cycle
    """What an answer says it used (`usage`): chat, completions and embeddings name its
    parts prompt and completion tokens, the Responses API input and output tokens, a rerank
    or score answer only its total (all prompt)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


def in_tokens(usage: Usage | None) -> Usage | None:
    """`usage` read as prompt and completion tokens whatever its API named them; None when it
    counts no tokens (a transcription's is in seconds): what was reserved then stands. Not
    a __post_init__: that would be a Python call on every answer's decode."""
    if usage is None or usage.prompt_tokens or usage.completion_tokens:
        return usage
    if usage.input_tokens or usage.output_tokens:  # a Response's
        usage.prompt_tokens, usage.completion_tokens = usage.input_tokens, usage.output_tokens
    elif usage.total_tokens:  # rerank, score: all prompt
        usage.prompt_tokens = usage.total_tokens
    else:
        return None
    return usage


class _WithUsage(msgspec.Struct, gc=False):
    usage: Usage | None = None


_decode_usage = msgspec.json.Decoder(_WithUsage).decode


class _Identified(msgspec.Struct):
    id: str = ""


_decode_id = msgspec.json.Decoder(_Identified).decode


def response_id_of(body: bytes) -> str:
    """A whole answer's `id` ("" without one)."""
    try:
        return _decode_id(body).id
    except msgspec.DecodeError:
        return ""


def usage_of(body: bytes) -> Usage | None:
    """The `usage` of a whole answer (chat, completions, embeddings, a Response, rerank);
    None without one, or with none in tokens (a transcription's is in seconds): what was
    reserved for it then stands."""
    try:
        usage = _decode_usage(body).usage
    except msgspec.DecodeError:
        return None
    if usage is not None and usage.prompt_tokens:  # chat's and completions' (no call)
        return usage
    return in_tokens(usage)
