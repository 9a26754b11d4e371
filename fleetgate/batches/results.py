"""The lines of a batch's output and error files, as OpenAI writes them, and what a restart
reads back from them:

    {"id": "batch_req_...", "custom_id": "q1",
     "response": {"status_code": 200, "request_id": "...", "body": {...}}, "error": null}
    {"id": "batch_req_...", "custom_id": "q2", "response": null,
     "error": {"code": "batch_expired", "message": "..."}}
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from fleetgate.openai_api import usage_of


class _Response(msgspec.Struct, omit_defaults=False):
    status_code: int
    request_id: str
    body: msgspec.Raw  # the answer's JSON as it came (a JSON string if it was not JSON)


class _Error(msgspec.Struct, omit_defaults=False):
    code: str
    message: str


class _Line(msgspec.Struct, omit_defaults=False):
    id: str
    custom_id: str
    response: _Response | None
    error: _Error | None


class _SeenResponse(msgspec.Struct):
    body: msgspec.Raw = msgspec.Raw(b"null")


class _Seen(msgspec.Struct):
    custom_id: str
    response: _SeenResponse | None = None


_encode = msgspec.json.Encoder().encode
_seen = msgspec.json.Decoder(_Seen)
_raw = msgspec.json.Decoder(msgspec.Raw)


def answer_line(line_id: str, custom_id: str, status: int, request_id: str, body: bytes) -> bytes:
    """The line of a request that got an answer (any status)."""
    try:
        answer = _raw.decode(body)
    except msgspec.DecodeError:
        answer = msgspec.Raw(_encode(body.decode("utf-8", "replace")))
    return _encode(_Line(line_id, custom_id, _Response(status, request_id, answer), None))


def error_line(line_id: str, custom_id: str, code: str, message: str) -> bytes:
    """The line of a request the gateway could not run."""
    return _encode(_Line(line_id, custom_id, None, _Error(code, message)))


def tokens(body: bytes) -> tuple[int, int]:
    """The prompt and completion tokens an answer's `usage` reports (0, 0 without one)."""
    usage = usage_of(body)
    return (0, 0) if usage is None else (usage.prompt_tokens, usage.completion_tokens)


@dataclass(slots=True)
class ReadBack:
    """What one results file says: whose requests it answers, and their tokens."""

    custom_ids: set[str] = field(default_factory=set)
    lines: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


def read_back(lines: list[bytes]) -> ReadBack:
    """The requests a results file holds a line for (a line not the gateway's is skipped: its
    request runs again)."""
    back = ReadBack()
    for line in lines:
        try:
            seen = _seen.decode(line)
        except msgspec.DecodeError:
            continue
        back.custom_ids.add(seen.custom_id)
        back.lines += 1
        if seen.response is not None:
            prompt, completion = tokens(bytes(seen.response.body))
            back.input_tokens += prompt
            back.output_tokens += completion
    return back
