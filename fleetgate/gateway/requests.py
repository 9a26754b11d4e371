"""Parsing of OpenAI request bodies: only what routing needs, validated, the rest left as bytes.

Fields are typed as the OpenAI API types them; a wrong type or a missing field becomes a
a 400 `Refused` naming the field (`param`) and saying what to send instead. Before any of it, the
whole body must be UTF-8 and nest at most `MAX_DEPTH` levels (`check_body`): what the gateway
leaves as bytes goes to the backend as it is, and a backend that fails on it must not be the
one blamed.
"""

from __future__ import annotations

import codecs
import logging
from typing import TypeVar

import msgspec

from fleetgate.routing.base import RoutingRequest
from fleetgate.traffic.door import Refused


def bad_request(
    message: str, param: str | None = None, status: int = 400, code: str | None = None
) -> Refused:
    """The refusal of a body the gateway cannot route: a 4xx the edge answers like any other
    (traffic/door.py's `Refused`)."""
    return Refused(status, message, code, param=param)


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


class ResponsesBody(msgspec.Struct):
    """`POST /v1/responses` (OpenAI's Responses API), as far as routing reads it."""

    model: str
    input: str | list[msgspec.Raw] | None = None
    instructions: str | None = None
    stream: bool | None = None
    max_output_tokens: int | None = None
    user: str | None = None
    previous_response_id: str | None = None


class ModelBody(msgspec.Struct):
    """Any other model path (rerank, score, tokenize, moderations): its `model` alone."""

    model: str
    user: str | None = None


log = logging.getLogger(__name__)
_T = TypeVar("_T")

MAX_DEPTH = 64  # arrays and objects inside each other; OpenAI's own schemas need < 20
_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}"')


def check_body(body: bytes) -> None:
    """A 400 `Refused` unless the body is UTF-8 and nests at most MAX_DEPTH levels.

    msgspec checks the UTF-8 of the strings it decodes, not of the values it skips or keeps
    raw (the messages), and refuses depth only past the interpreter's recursion limit (about
    1,000). Measured cost (parsing a chat body costs ~300 ns per KB): UTF-8, ~35 ns per KB
    for an ASCII body (`isascii`), ~330 ns for one with non-ASCII text (the C decoder);
    depth, ~0.6 us for a 2 KB body and ~20 ns per KB for a large one with few brackets, and
    up to ~8 us more plus ~0.4 us per KB for one with over MAX_DEPTH opening brackets (a
    conversation of some 30 messages or more).
    """
    if not body.isascii():
        try:
            codecs.utf_8_decode(body, "strict", True)
        except UnicodeDecodeError as exc:
            raise bad_request(
                f"The body is not valid UTF-8 (byte 0x{body[exc.start]:02x} at offset "
                f"{exc.start}); send JSON encoded as UTF-8."
            ) from None
    if _deeper_than(body, MAX_DEPTH):
        raise bad_request(
            f"The body nests arrays and objects more than {MAX_DEPTH} levels deep; send a "
            "flatter one."
        )


def _deeper_than(body: bytes, limit: int) -> bool:
    """Whether JSON `body` nests more than `limit` levels (for invalid JSON: either answer;
    the parser refuses it next)."""
    # Fewer opening brackets than the limit, strings included, cannot nest deeper. A small
    # body is counted in two C calls; a large one is searched (memchr) only as far as the
    # limit's worth of brackets, ~20 ns per KB.
    if len(body) < 65536:
        if body.count(b"[") + body.count(b"{") <= limit:
            return False
        return _depth_over(body, limit)
    opening = 0
    for bracket in (b"[", b"{"):
        at = body.find(bracket)
        while at >= 0:
            opening += 1
            if opening > limit:
                return _depth_over(body, limit)
            at = body.find(bracket, at + 1)
    return False


def _depth_over(body: bytes, limit: int) -> bool:
    """The exact test, in C passes over the bytes (~0.5 us per KB): drop escaped backslashes
    and quotes; keep only quotes and brackets; drop strings, what is inside them too; then
    each pass of removing every `[]` takes one level off every innermost pair."""
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Most strings hold no bracket and are `""` now. Removing every `""` keeps what is outside
    # strings as it was: an empty string goes, or two strings with nothing between become one.
    structure = body.translate(_BRACKETS, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in structure:
        structure = b"".join(structure.split(b'"')[::2])
    for _ in range(limit):
        if not structure:
            return False
        structure = structure.replace(b"[]", b"")
    return bool(structure)


def _decode(decoder: msgspec.json.Decoder[_T], body: bytes, fields: str) -> _T:
    check_body(body)
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise _translate(exc, fields) from None
    except Exception as exc:  # the client's bytes must never become the gateway's 500
        log.warning("unexpected error decoding a request body: %r", exc)
        raise bad_request(
            f"The body could not be read ({type(exc).__name__}). Send a JSON object with {fields}."
        ) from None


_chat = msgspec.json.Decoder(ChatBody)
_completion = msgspec.json.Decoder(CompletionBody)
_embedding = msgspec.json.Decoder(EmbeddingBody)
_responses = msgspec.json.Decoder(ResponsesBody)
_model_only = msgspec.json.Decoder(ModelBody)


def _translate(exc: msgspec.DecodeError, fields: str) -> Refused:
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        message, _, where = text.partition(" - at `$.")
        param = where.rstrip("`").split("[", 1)[0].split(".", 1)[0] or None
        if message.startswith("Object missing required field"):
            param = message.split("`")[1]
            return bad_request(f"`{param}` is required: send a body with {fields}.", param)
        if message.startswith("Expected `object`"):
            return bad_request(f"The body must be a JSON object with {fields}.")
        return bad_request(f"Invalid `{param}`: {message.lower()}. Fix the field and retry.", param)
    return bad_request(f"The body is not valid JSON ({text}). Send a JSON object with {fields}.")


def _session(headers: dict[bytes, bytes], user: str | None) -> str | None:
    key = headers.get(b"x-session-id")
    return key.decode("latin-1") if key is not None else user


def _prompt_bytes(prompt: str | list[msgspec.Raw]) -> bytes:
    return prompt.encode() if isinstance(prompt, str) else b"".join(prompt)


def parse_chat(body: bytes, headers: dict[bytes, bytes]) -> RoutingRequest:
    parsed = _decode(_chat, body, "`model` and `messages`")
    if not parsed.messages:
        raise bad_request("`messages` must be a non-empty array of messages.", "messages")
    return RoutingRequest(
        parsed.model,
        "chat",
        bool(parsed.stream),
        parsed.max_completion_tokens or parsed.max_tokens,
        _session(headers, parsed.user),
        b",".join(parsed.messages),
    )


def parse_completion(body: bytes, headers: dict[bytes, bytes]) -> RoutingRequest:
    parsed = _decode(_completion, body, "`model` and `prompt`")
    if parsed.prompt is None or parsed.prompt == []:
        raise bad_request("`prompt` is required: send a string or an array of strings.", "prompt")
    return RoutingRequest(
        parsed.model,
        "completions",
        bool(parsed.stream),
        parsed.max_tokens,
        _session(headers, parsed.user),
        _prompt_bytes(parsed.prompt),
    )


def parse_embedding(body: bytes, headers: dict[bytes, bytes]) -> RoutingRequest:
    parsed = _decode(_embedding, body, "`model` and `input`")
    if parsed.input is None or parsed.input == []:
        raise bad_request("`input` is required: send a string or a non-empty array.", "input")
    return RoutingRequest(parsed.model, "embeddings", False, None, parsed.user)


def parse_responses(body: bytes, headers: dict[bytes, bytes]) -> RoutingRequest:
    parsed = _decode(_responses, body, "`model` and `input`")
    if parsed.input is None or parsed.input == [] or parsed.input == "":
        raise bad_request("`input` is required: send a string or an array of input items.", "input")
    if parsed.max_output_tokens is not None and parsed.max_output_tokens < 1:
        raise bad_request("`max_output_tokens` must be at least 1.", "max_output_tokens")
    text = parsed.input.encode() if isinstance(parsed.input, str) else b"".join(parsed.input)
    if parsed.instructions:
        text = parsed.instructions.encode() + text
    return RoutingRequest(
        model=parsed.model,
        endpoint="responses",
        stream=bool(parsed.stream),
        max_tokens=parsed.max_output_tokens,
        session_key=_session(headers, parsed.user),
        prompt=text,
        follows=parsed.previous_response_id,
    )


FORM = b"multipart/form-data"


def is_form(headers: dict[bytes, bytes]) -> bool:
    return headers.get(b"content-type", b"")[: len(FORM)].lower() == FORM


def parse_passthrough(body: bytes, headers: dict[bytes, bytes]) -> RoutingRequest:
    """A body for a pass-through path (`server.passthrough_paths`): JSON, or a form upload.
    Its answer is relayed whole: one that streams (a transcription asked to) is read to its
    end first, then sent."""
    if is_form(headers):
        return parse_multipart_model(body, headers)
    return parse_model_path(body, headers)


def parse_model_path(body: bytes, headers: dict[bytes, bytes]) -> RoutingRequest:
    """A pass-through path's JSON body: routed by its `model`; the whole body counts as its
    prompt."""
    parsed = _decode(_model_only, body, "`model`")
    return RoutingRequest(parsed.model, "other", False, None, _session(headers, parsed.user), body)


def parse_multipart_model(body: bytes, headers: dict[bytes, bytes]) -> RoutingRequest:
    """A pass-through path's `multipart/form-data` body (an audio transcription): routed by
    its `model` field."""
    model = multipart_field(body, headers.get(b"content-type", b""), b"model")
    if model is None:
        raise bad_request("Send the form field `model` (multipart/form-data).", "model")
    try:
        name = model.decode()
    except UnicodeDecodeError:
        raise bad_request("The form field `model` is not valid UTF-8.", "model") from None
    return RoutingRequest(name, "other", False, None, _session(headers, None), b"")


def multipart_field(body: bytes, content_type: bytes, name: bytes) -> bytes | None:
    """The value of the form field `name` in a `multipart/form-data` body, or None (RFC 7578:
    parts separated by `--boundary` lines, each with a Content-Disposition naming it).
    a 400 `Refused` when the body names it twice: an engine that reads the other one would be
    served a model the gateway did not route (and price) the request for."""
    part = _form_part(body, content_type, name)
    return None if part is None else part[1]


def multipart_file(body: bytes, content_type: bytes, name: bytes) -> tuple[str, bytes] | None:
    """The file sent as form field `name`: its `filename` ("" without one) and content."""
    part = _form_part(body, content_type, name)
    if part is None:
        return None
    filename = ""
    for param in part[0]:
        key, _, value = param.partition(b"=")
        if key.strip().lower() == b"filename":
            filename = value.strip().strip(b'"').decode("utf-8", "replace")
    return filename, part[1]


def _form_part(body: bytes, content_type: bytes, name: bytes) -> tuple[list[bytes], bytes] | None:
    """The Content-Disposition parameters and the value of the part named `name` (None when
    there is none; a 400 `Refused` when there are two)."""
    kind, _, params = content_type.partition(b";")
    if kind.strip().lower() != b"multipart/form-data":
        return None
    boundary = b""
    for param in params.split(b";"):
        key, _, value = param.strip().partition(b"=")
        if key.lower() == b"boundary":
            boundary = value.strip(b'"')
    if not boundary or len(boundary) > 70:
        return None
    wanted = b'name="' + name + b'"'
    found: tuple[list[bytes], bytes] | None = None
    # A delimiter starts a line (RFC 2046): text that merely contains it is a part's content.
    for part in (b"\r\n" + body).split(b"\r\n--" + boundary)[1:]:
        head, sep, value = part.partition(b"\r\n\r\n")
        if not sep:
            continue
        for line in head.split(b"\r\n"):
            field, _, disposition = line.partition(b":")
            if field.strip().lower() != b"content-disposition":
                continue
            fields = [p.strip() for p in disposition.split(b";")]
            if wanted in fields:  # not filename="..."
                if found is not None:
                    raise bad_request(
                        f"The form names `{name.decode()}` twice; send it once.", name.decode()
                    )
                found = fields, value
    return found
