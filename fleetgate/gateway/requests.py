"""Parsing of OpenAI request bodies: only what routing needs, validated, the rest left as bytes.

Fields are typed as the OpenAI API types them; a wrong type or a missing field becomes a
`BadRequest` naming the field (`param`) and saying what to send instead.
"""

from __future__ import annotations

import math

import msgspec

from fleetgate.fleet.pool import Timeouts
from fleetgate.routing.base import RoutingRequest


class BadRequest(Exception):
    """The client sent something the gateway cannot route; becomes a 4xx."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code


class _Common(msgspec.Struct, kw_only=True):
    model: str
    stream: bool | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    user: str | None = None


class ChatBody(_Common):
    messages: list[msgspec.Raw]


class CompletionBody(_Common):
    prompt: str | list[msgspec.Raw] | None = None


class EmbeddingBody(msgspec.Struct):
    model: str
    input: str | list[msgspec.Raw] | None = None
    user: str | None = None


_top_level = msgspec.json.Decoder(dict[str, msgspec.Raw])
_encode = msgspec.json.Encoder().encode


def with_fields(body: bytes, drop: tuple[str, ...] = (), **fields: object) -> bytes:
    """The body with top-level `fields` set and `drop` removed; every other field passes
    through as the client wrote it (only the top level is decoded)."""
    top = _top_level.decode(body)
    for name in drop:
        top.pop(name, None)
    for name, value in fields.items():
        top[name] = msgspec.Raw(_encode(value))
    return _encode(top)


def with_model(body: bytes, model: str) -> bytes:
    """The body with its `model` replaced (for a model alias, split or tier)."""
    return with_fields(body, model=model)


# What a prefill engine is asked for, as vLLM's disaggregation proxies ask it.
PREFILL_HANDOFF = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}  # fmt: skip


def prefill_body(body: bytes) -> bytes:
    """The body for the prefill half of a disaggregated request: one token (whichever limit
    the client used), not streamed, with kv_transfer_params asking the engine to keep the KV
    for a remote decode."""
    return with_fields(
        body, ("stream_options", "min_tokens", "max_completion_tokens"), stream=False,
        max_tokens=1, kv_transfer_params=PREFILL_HANDOFF,
    )  # fmt: skip


class _Handoff(msgspec.Struct):
    kv_transfer_params: dict[str, msgspec.Raw] | None = None


_handoff = msgspec.json.Decoder(_Handoff)


def handoff_params(prefill_answer: bytes) -> dict[str, msgspec.Raw] | None:
    """The kv_transfer_params a prefill engine answered with, or None."""
    try:
        return _handoff.decode(prefill_answer).kv_transfer_params
    except msgspec.DecodeError:
        return None


_chat = msgspec.json.Decoder(ChatBody)
_completion = msgspec.json.Decoder(CompletionBody)
_embedding = msgspec.json.Decoder(EmbeddingBody)


def _translate(exc: msgspec.DecodeError, fields: str) -> BadRequest:
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        message, _, where = text.partition(" - at `$.")
        param = where.rstrip("`").split("[", 1)[0].split(".", 1)[0] or None
        if message.startswith("Object missing required field"):
            param = message.split("`")[1]
            return BadRequest(f"`{param}` is required: send a body with {fields}.", param)
        if message.startswith("Expected `object`"):
            return BadRequest(f"The body must be a JSON object with {fields}.")
        return BadRequest(f"Invalid `{param}`: {message.lower()}. Fix the field and retry.", param)
    return BadRequest(f"The body is not valid JSON ({text}). Send a JSON object with {fields}.")


def _session(headers: dict[bytes, bytes], user: str | None) -> str | None:
    key = headers.get(b"x-session-id")
    return key.decode("latin-1") if key is not None else user


def _prompt_bytes(prompt: str | list[msgspec.Raw]) -> bytes:
    return prompt.encode() if isinstance(prompt, str) else b"".join(prompt)


def parse_chat(body: bytes, headers: dict[bytes, bytes]) -> RoutingRequest:
    try:
        parsed = _chat.decode(body)
    except msgspec.DecodeError as exc:
        raise _translate(exc, "`model` and `messages`") from None
    if not parsed.messages:
        raise BadRequest("`messages` must be a non-empty array of messages.", "messages")
    return RoutingRequest(
        parsed.model,
        "chat",
        bool(parsed.stream),
        parsed.max_completion_tokens or parsed.max_tokens,
        _session(headers, parsed.user),
        b"".join(parsed.messages),
    )


def parse_completion(body: bytes, headers: dict[bytes, bytes]) -> RoutingRequest:
    try:
        parsed = _completion.decode(body)
    except msgspec.DecodeError as exc:
        raise _translate(exc, "`model` and `prompt`") from None
    if parsed.prompt is None or parsed.prompt == []:
        raise BadRequest("`prompt` is required: send a string or an array of strings.", "prompt")
    return RoutingRequest(
        parsed.model,
        "completions",
        bool(parsed.stream),
        parsed.max_tokens,
        _session(headers, parsed.user),
        _prompt_bytes(parsed.prompt),
    )


def parse_embedding(body: bytes, headers: dict[bytes, bytes]) -> RoutingRequest:
    try:
        parsed = _embedding.decode(body)
    except msgspec.DecodeError as exc:
        raise _translate(exc, "`model` and `input`") from None
    if parsed.input is None or parsed.input == []:
        raise BadRequest("`input` is required: send a string or a non-empty array.", "input")
    return RoutingRequest(parsed.model, "embeddings", False, None, parsed.user)


# Per-request overrides of the pool's timeouts, in seconds.
TIMEOUT_HEADERS = (
    (b"x-fleetgate-first-byte-timeout-s", "first_byte_s"),
    (b"x-fleetgate-idle-timeout-s", "idle_s"),
    (b"x-fleetgate-total-timeout-s", "total_s"),
)


def request_timeouts(pool: Timeouts, headers: dict[bytes, bytes]) -> Timeouts:
    """The pool's timeouts, with any the request overrides by header."""
    changes: dict[str, float] = {}
    for name, field in TIMEOUT_HEADERS:
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not 0 < seconds < math.inf:
            header = name.decode()
            raise BadRequest(f"The {header} header must be a number of seconds > 0.", header)
        changes[field] = seconds
    if not changes:
        return pool
    return Timeouts(
        changes.get("first_byte_s", pool.first_byte_s),
        changes.get("total_s", pool.total_s),
        changes.get("idle_s", pool.idle_s),
        pool.connect_s,
    )
