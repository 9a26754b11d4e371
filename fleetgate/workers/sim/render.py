"""Chat and text completions with more than the plain answer (several choices, logprobs, tool
calls, echo, a cut or structured answer), streamed and whole, shaped as OpenAI and vLLM shape
them. A plain answer is rendered from byte templates instead (responses.py).

Streams: each token is one chunk of its choice (index), sent as the engine produces it, so
choices interleave; a token whose visible text is empty (the stop text hidden) sends nothing.
A chat choice's first chunk carries the role; a tool call's first chunk carries the call's
index, id, type, name and empty arguments, the next ones pieces of the arguments. Each choice
gets its finish chunk when its last token is out; the usage chunk, when asked, comes after all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from fleetgate.openai_api import DONE_EVENT
from fleetgate.tokens import split_tokens
from fleetgate.workers.sim.plans import ChoicePlan
from fleetgate.workers.sim.request import Job
from fleetgate.workers.sim.responses import Usage
from fleetgate.workers.sim.sampling import token_logprobs

_encode = msgspec.json.encode
_ROLE = {"role": "assistant", "content": ""}


class Renderer(Protocol):
    """Turns a job's tokens into what its client receives."""

    def opening(self) -> bytes:
        """A stream's first bytes, before any token."""

    def token(self, plan: ChoicePlan, i: int) -> bytes:
        """What token `i` of `plan` adds to the stream."""

    def finish(self, plan: ChoicePlan) -> bytes:
        """What the stream says when `plan`'s last token is out."""

    def closing(self, usage: Usage) -> bytes:
        """A stream's last bytes, once every choice has finished."""

    def whole(self, usage: Usage, extra: dict[str, Any] | None) -> bytes:
        """The answer as one JSON body (`extra`: more top-level fields)."""


class CompletionRenderer:
    """Renders a chat or text completion job (see the module docstring)."""

    def __init__(self, job: Job, model: str) -> None:
        self._job = job
        self._top = job.logprobs
        obj = "chat.completion.chunk" if job.chat else "text_completion"
        self._head = _encode({"id": job.request_id, "object": obj, "created": job.created,
                              "model": model})[:-1] + b',"choices":['  # fmt: skip
        self._model = model
        self._offsets = [0] * len(job.choices)  # text sent per choice (text_offset)

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        return b"".join((b"data: ", self._head, _encode(choice), b"]}\n\n"))

    def opening(self) -> bytes:
        return b""

    def token(self, plan: ChoicePlan, i: int) -> bytes:
        piece = plan.piece(i)
        if not self._job.chat:
            text = plan.echo + piece if i == 0 else piece
            if not text:
                return b""
            logprobs = None
            if self._top is not None:
                logprobs = self._legacy(plan, i, i + 1, self._offsets[plan.index], i == 0)
            self._offsets[plan.index] += len(text)
            choice = {"index": plan.index, "text": text, "logprobs": logprobs,
                      "finish_reason": None}  # fmt: skip
            return self._chunk(choice)
        role = self._chunk(_delta(plan.index, _ROLE)) if i == 0 else b""
        call = plan.tool_call
        if call is not None:
            head = {"index": 0, "id": call.id, "type": "function",
                    "function": {"name": call.name, "arguments": ""}}  # fmt: skip
            fragment = {"index": 0, "function": {"arguments": piece}}
            return role + self._chunk(_delta(plan.index, {"tool_calls": [fragment if i else head]}))
        if not piece:
            return role
        logprobs = None if self._top is None else {"content": [self._entry(plan, i)]}
        return role + self._chunk(_delta(plan.index, {"content": piece}, logprobs))

    def finish(self, plan: ChoicePlan) -> bytes:
        choice: dict[str, Any] = {"index": plan.index}
        if self._job.chat:
            choice["delta"] = {}
        else:
            choice["text"] = ""
        choice |= {"logprobs": None, "finish_reason": plan.finish_reason}
        return self._chunk(choice)

    def closing(self, usage: Usage) -> bytes:
        if not self._job.include_usage:
            return DONE_EVENT
        return b"".join((b"data: ", self._head, b'],"usage":', _encode(usage), b"}\n\n",
                         DONE_EVENT))  # fmt: skip

    def whole(self, usage: Usage, extra: dict[str, Any] | None) -> bytes:
        job = self._job
        choices = [self._whole_choice(plan) for plan in job.choices]
        body: dict[str, Any] = {
            "id": job.request_id,
            "object": "chat.completion" if job.chat else "text_completion",
            "created": job.created,
            "model": self._model,
            "choices": choices,
            "usage": usage,
        }
        return _encode(body | (extra or {}))

    def _whole_choice(self, plan: ChoicePlan) -> dict[str, Any]:
        text = plan.text()
        choice: dict[str, Any] = {"index": plan.index}
        if not self._job.chat:
            logprobs = None
            if self._top is not None:
                logprobs = self._legacy(plan, 0, plan.count, 0, True)
            return choice | {"text": plan.echo + text, "logprobs": logprobs,
                             "finish_reason": plan.finish_reason}  # fmt: skip
        call = plan.tool_call
        message: dict[str, Any] = {"role": "assistant", "content": text}
        logprobs = None
        if call is not None:
            function = {"name": call.name, "arguments": text}
            calls = [{"id": call.id, "type": "function", "function": function}]
            message = {"role": "assistant", "content": None, "tool_calls": calls}
        elif self._top is not None:
            entries = [self._entry(plan, i) for i in range(plan.count) if plan.piece(i)]
            logprobs = {"content": entries}
        return choice | {"message": message, "logprobs": logprobs,
                         "finish_reason": plan.finish_reason}  # fmt: skip

    def _entry(self, plan: ChoicePlan, i: int) -> dict[str, Any]:
        """Chat's logprobs entry for token `i` of `plan`."""
        token = plan.piece(i)
        chosen, top = token_logprobs(token, plan.seed, plan.offset + i, self._top or 0)
        return {"token": token, "logprob": chosen, "bytes": list(token.encode()),
                "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())}
                                 for t, lp in top]}  # fmt: skip

    def _legacy(
        self, plan: ChoicePlan, start: int, end: int, offset: int, with_echo: bool
    ) -> dict[str, Any]:
        """Completions' logprobs for tokens `start` to `end` of `plan` whose text begins at
        `offset`; with the echoed prompt's tokens first (the first of them has none)."""
        k = max(1, self._top or 0)  # the chosen token is always listed, as vLLM does
        tokens: list[str] = []
        chosen: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        if with_echo and plan.echo:
            for j, token in enumerate(split_tokens(plan.echo)):
                lp, top = token_logprobs(token, plan.seed, -1 - j, k)
                tokens.append(token)
                chosen.append(None if j == 0 else lp)
                tops.append(None if j == 0 else dict(top))
        for i in range(start, end):
            token = plan.piece(i)
            if token:
                lp, top = token_logprobs(token, plan.seed, plan.offset + i, k)
                tokens.append(token)
                chosen.append(lp)
                tops.append(dict(top))
        return {"tokens": tokens, "token_logprobs": chosen, "top_logprobs": tops,
                "text_offset": _offsets(tokens, offset)}  # fmt: skip


def _delta(index: int, delta: dict[str, Any], logprobs: Any = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}


def _offsets(tokens: Sequence[str], start: int) -> list[int]:
    out = []
    for token in tokens:
        out.append(start)
        start += len(token)
    return out
