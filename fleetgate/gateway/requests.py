"""Parsing of OpenAI request bodies: only what routing needs, validated, the rest left as bytes.

Fields are typed as the OpenAI API types them; a wrong type or a missing field becomes a
`BadRequest` naming the field (`param`) and saying what to send instead.
"""

from __future__ import annotations

import math

import msgspec

from fleetgate.openai_api import with_fields
from fleetgate.routing.base import RoutingRequest
from fleetgate.upstream.timeouts import Timeouts


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


def with_model(body: bytes, model: str) -> bytes:
    """The body with its `model` replaced (for a model alias, split or tier)."""
    return with_fields(body, model=model)


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
