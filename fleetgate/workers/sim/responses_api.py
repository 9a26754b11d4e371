"""OpenAI's Responses API (`POST /v1/responses`) on the sim worker, as vLLM serves it: a request
becomes the chat completion it amounts to, and its answer is rendered as a response object or
as the typed events OpenAI streams.

Read: `input` (a string, or message items whose content is a string or input_text /
output_text parts), `instructions` (a system message first), `max_output_tokens`, `stream`;
tools and reasoning are not simulated. Responses are stored as vLLM stores them, in this
worker's memory only (the last `STORED` ids): a `previous_response_id` it does not hold is a 404,
as vLLM answers one made by another replica (the gateway routes a follow-up to the replica that
holds its response); one it holds is taken, though the sim does not read the earlier turn.
A response that reaches `max_output_tokens` is "incomplete" (reason "max_output_tokens"),
otherwise "completed". A stream sends `event: <type>` + `data: {..., "sequence_number": n}`:
response.created, response.in_progress, response.output_item.added,
response.content_part.added, one response.output_text.delta per token,
response.output_text.done, response.content_part.done, response.output_item.done, then
response.completed (as vLLM ends every stream, a response cut at the limit included: its
`status` says "incomplete"; the SDK's stream helpers need that event), and no [DONE].
"""

from __future__ import annotations

from typing import Any

import msgspec

from fleetgate.workers.sim.plans import ChoicePlan
from fleetgate.workers.sim.request import Body, GenerationError, Job, RequestParser
from fleetgate.workers.sim.responses import Usage

_encode = msgspec.json.encode


class _ResponsesBody(msgspec.Struct):
    input: str | list[Any]
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    stream: bool | None = None
    previous_response_id: str | None = None


STORED = 10_000  # response ids a worker remembers


class ResponsesRequests:
    """Turns Responses API requests into jobs for one worker's parser. Ids are this worker's
    `prefix` and a serial, unique across a fleet."""

    def __init__(self, parser: RequestParser, prefix: str) -> None:
        self._parser = parser
        self._decode = msgspec.json.Decoder(_ResponsesBody)
        self._prefix = prefix
        self._stored: dict[str, None] = {}  # ids, oldest first

    def parse(self, raw: bytes, serial: str) -> tuple[Job, ResponseRenderer]:
        try:
            body = self._decode.decode(raw)
        except msgspec.DecodeError as exc:
            raise GenerationError(400, f"invalid request body: {exc}") from None
        previous = body.previous_response_id
        if previous is not None and previous not in self._stored:
            message = f"Response with id '{previous[:80]}' not found."
            raise GenerationError(404, message, "previous_response_id")
        if body.max_output_tokens is not None and body.max_output_tokens < 1:
            message = "max_output_tokens must be at least 1"
            raise GenerationError(400, message, "max_output_tokens")
        messages = _messages(body.input)
        if body.instructions:
            messages.insert(0, {"role": "system", "content": body.instructions})
        chat = Body(model=body.model, messages=messages, max_tokens=body.max_output_tokens,
                    stream=body.stream)  # fmt: skip
        job = self._parser.job(chat, True, f"resp_{self._prefix}{serial}")
        self._stored[job.request_id] = None
        if len(self._stored) > STORED:
            del self._stored[next(iter(self._stored))]
        return job, ResponseRenderer(job, self._parser.model, body)


def _messages(given: str | list[Any]) -> list[dict[str, Any]]:
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    messages = []
    for i, item in enumerate(given):
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            message = f"input[{i}]: the sim takes message items only"
            raise GenerationError(400, message, "input")
        content = item.get("content")
        if isinstance(content, list):
            texts = [p.get("text") if isinstance(p, dict) else None for p in content]
            strings = [t for t in texts if isinstance(t, str)]
            content = "\n".join(strings) if len(strings) == len(texts) else None
        if not isinstance(item.get("role"), str) or not isinstance(content, str):
            message = f"input[{i}] needs a role and a content string or text parts"
            raise GenerationError(400, message, "input")
        messages.append({"role": item["role"], "content": content})
    if not messages:
        raise GenerationError(400, "input must be a string or a non-empty array", "input")
    return messages


class ResponseRenderer:
    """Renders one Responses API job (see the module docstring); a `Renderer`."""

    def __init__(self, job: Job, model: str, body: _ResponsesBody) -> None:
        self._job = job
        self._sequence = 0
        self._item_id = "msg_" + job.request_id.removeprefix("resp_")
        self._model = model
        self._body = body

    def _event(self, kind: str, fields: dict[str, Any]) -> bytes:
        data = {"type": kind, **fields, "sequence_number": self._sequence}
        self._sequence += 1
        return b"".join((b"event: ", kind.encode(), b"\ndata: ", _encode(data), b"\n\n"))

    def _response(
        self, status: str, output: list[dict[str, Any]], usage: Usage | None
    ) -> dict[str, Any]:
        job = self._job
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": job.request_id, "object": "response", "created_at": job.created,
            "status": status, "error": None, "incomplete_details": incomplete,
            "instructions": self._body.instructions,
            "max_output_tokens": self._body.max_output_tokens, "model": self._model,
            "output": output, "parallel_tool_calls": True, "temperature": 1.0,
            "tool_choice": "auto", "tools": [], "top_p": 1.0,
            "text": {"format": {"type": "text"}}, "truncation": "disabled", "metadata": {},
            "usage": None if usage is None else _usage(usage),
        }  # fmt: skip

    def _message(self, status: str, text: str | None) -> dict[str, Any]:
        content = [] if text is None else [_part(text)]
        return {"id": self._item_id, "type": "message", "status": status, "role": "assistant",
                "content": content}  # fmt: skip

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._item_id, "output_index": 0, "content_index": 0}

    def opening(self) -> bytes:
        started = self._response("in_progress", [], None)
        return b"".join((
            self._event("response.created", {"response": started}),
            self._event("response.in_progress", {"response": started}),
            self._event("response.output_item.added",
                        {"output_index": 0, "item": self._message("in_progress", None)}),
            self._event("response.content_part.added", {**self._where(), "part": _part("")}),
        ))  # fmt: skip

    def token(self, plan: ChoicePlan, i: int) -> bytes:
        piece = plan.piece(i)
        if not piece:
            return b""
        return self._event("response.output_text.delta",
                           {**self._where(), "delta": piece, "logprobs": []})  # fmt: skip

    def finish(self, plan: ChoicePlan) -> bytes:
        text, status = plan.text(), _status(plan)
        return b"".join((
            self._event("response.output_text.done", {**self._where(), "text": text,
                                                      "logprobs": []}),
            self._event("response.content_part.done", {**self._where(), "part": _part(text)}),
            self._event("response.output_item.done",
                        {"output_index": 0, "item": self._message(status, text)}),
        ))  # fmt: skip

    def closing(self, usage: Usage) -> bytes:
        plan = self._job.choices[0]
        status = _status(plan)
        done = self._response(status, [self._message(status, plan.text())], usage)
        return self._event("response.completed", {"response": done})

    def whole(self, usage: Usage, extra: dict[str, Any] | None) -> bytes:
        plan = self._job.choices[0]
        status = _status(plan)
        return _encode(self._response(status, [self._message(status, plan.text())], usage))


def _status(plan: ChoicePlan) -> str:
    return "incomplete" if plan.finish_reason == "length" else "completed"


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _usage(u: Usage) -> dict[str, Any]:
    cached = (u.prompt_tokens_details or {}).get("cached_tokens", 0)
    return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total_tokens}  # fmt: skip
