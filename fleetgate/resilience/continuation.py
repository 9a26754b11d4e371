"""Continuing a stream on another backend after its backend failed mid-answer.

The relay keeps a `StreamProgress` (upstream/progress.py) of what the client has been sent,
choice by choice. When the backend breaks off, `plan_continuation` picks one of two ways on:

| the stream                                    | how it goes on                               |
|-----------------------------------------------|----------------------------------------------|
| every choice finished, only [DONE] missing    | [DONE] is sent (a usage asked for and not    |
|                                               |   sent yet: replay, which passes only it)    |
| n = 1, no tool call sent, a text prompt       | prefill: the prompt plus the text sent       |
| n > 1, a tool call under way, a prompt of     | replay (resilience/replay.py): the request   |
|   token ids or several prompts, or prefill    |   again, what the client has swallowed; only |
|   impossible (max_tokens spent)               |   with a `seed` or temperature 0             |
| anything else (replay without a `seed`)       | an error event, at once                      |

Prefill asks for the rest directly: `continuation_body` is the prompt plus the text already
streamed, with `max_tokens` reduced by what was sent; for chat the partial answer goes in as
an assistant message to continue (vLLM's `continue_final_message`, `add_generation_prompt:
false`), for completions it is appended to the prompt (an echoed prompt is not sent twice).
`Splicer` rewrites the new backend's events so that the client sees one stream: the same id
and creation time, no second role chunk, logprobs' `text_offset` counted from the answer's
start, usage counting every token once.

Replay sends the request as it was and matches the new answer against what the client has,
choice by choice (text, tool-call arguments, logprobs): tool calls and several choices carry
across whole, and an engine that answers otherwise the second time ends the stream with a
`continuation_diverged` error event rather than a different answer.

`Continuation` runs the whole step: up to `max_attempts - 1` backends not tried yet, each
asked for the rest of what is still missing; when none is left, or the stream cannot go on
faithfully, the client gets an error event: never silently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.engines import Resume
from fleetgate.http.errors import UpstreamError
from fleetgate.http.sse import SseDecoder
from fleetgate.lifecycle.events import Continued
from fleetgate.openai_api import DONE, DONE_EVENT, error_event, response_error_event
from fleetgate.resilience.cluster import Cluster
from fleetgate.resilience.replay import Replayer
from fleetgate.upstream.attempt import Attempts, Broken, Exchange, error_code
from fleetgate.upstream.progress import StreamProgress
from fleetgate.upstream.routed import routed

_NOT_RESUMABLE = (
    "the answer cannot be continued faithfully on another backend ({why}); send a `seed` "
    "(or temperature 0) to make such a stream resumable"
)


@dataclass(frozen=True, slots=True)
class Plan:
    """How a broken stream goes on (the table in the module docstring)."""

    way: Literal["done", "prefill", "replay", "refused"]
    body: bytes = b""  # what to send (prefill, replay)
    why: str = ""  # refused: why, for the client


def plan_continuation(
    original: bytes,
    chat: bool,
    progress: StreamProgress,
    resume: Resume = "continue_final_message",
) -> Plan:
    """The way on for a stream the client has `progress` of, on a backend whose engine
    continues an answer by `resume` (fleet/engines.py; "none": it cannot, so prefill is out)."""
    progress.settle()
    try:
        body = msgspec.json.decode(original)
    except msgspec.DecodeError:
        body = None
    if not isinstance(body, dict):
        return Plan("refused", why="the request could not be read again")
    if progress.finished and len(progress.choices) >= _choices_asked(body, chat):
        if progress.reported is not None or not _usage_asked(body) or not _deterministic(body):
            return Plan("done")  # (without a seed, a usage never sent stays unsent)
        return Plan("replay", original)  # for the usage alone: the rest is the client's
    several = len(progress.choices) > 1 or body.get("n") not in (1, None)
    if not several and not progress.tool_calls and resume != "none":
        rest = continuation_body(original, chat, progress, body, resume)
        if rest is not None:
            return Plan("prefill", rest)
    if not _deterministic(body):
        why = "several choices" if several else "a tool call under way"
        if not several and not progress.tool_calls:
            why = "the prompt or limits leave no room to append the answer"
            if resume == "none":
                why = "the other backends' engine cannot continue an answer"
        return Plan("refused", why=_NOT_RESUMABLE.format(why=why))
    return Plan("replay", original)


def _choices_asked(body: dict[str, Any], chat: bool) -> int:
    n = body.get("n")
    n = n if isinstance(n, int) and n > 0 else 1
    prompt = body.get("prompt")
    if not chat and isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return n * len(prompt)  # completions: n choices per prompt
    return n


def _usage_asked(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _deterministic(body: dict[str, Any]) -> bool:
    """The same request gets the same answer again: a `seed`, or greedy sampling."""
    seed = body.get("seed")
    return (isinstance(seed, int) and not isinstance(seed, bool)) or body.get("temperature") == 0


def continuation_body(
    original: bytes,
    chat: bool,
    progress: StreamProgress,
    body: dict[str, Any] | None = None,
    resume: Resume = "continue_final_message",
) -> bytes | None:
    """The request that asks another backend for the rest of a one-choice text answer (the
    prefill way), or None where the prompt or limits do not allow it. `body`: `original`
    decoded, if it was (it is changed). For chat, the partial answer is the last message:
    vLLM and SGLang are told to continue it; llama.cpp's server does so unasked (its
    assistant prefill), and is sent no fields it does not know."""
    progress.settle()
    if body is None:
        try:
            body = msgspec.json.decode(original)
        except msgspec.DecodeError:
            return None
        if not isinstance(body, dict):
            return None
    if body.get("n", 1) not in (1, None):
        return None
    for key in ("max_completion_tokens", "max_tokens"):
        limit = body.get(key)
        if isinstance(limit, int):
            if limit - progress.deltas < 1:
                return None
            body[key] = limit - progress.deltas
    min_tokens = body.get("min_tokens")
    if isinstance(min_tokens, int):
        body["min_tokens"] = max(0, min_tokens - progress.deltas)
    text = progress.text
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        body["messages"] = [*messages, {"role": "assistant", "content": text}]
        if resume == "continue_final_message":
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return None
        if body.get("echo"):  # the text sent begins with the prompt, echoed
            if not text.startswith(prompt):
                return None
            text, body["echo"] = text[len(prompt) :], False
        body["prompt"] = prompt + text
    body["stream"] = True
    return msgspec.json.encode(body)


class Splicer:
    """Rewrites a prefill continuation's SSE events into the stream the client already has."""

    __slots__ = ("_decoder", "_offset", "_progress", "_streamed")

    def __init__(self, progress: StreamProgress) -> None:
        progress.settle()
        self._decoder = SseDecoder()
        self._progress = progress
        self._streamed = progress.deltas  # tokens sent before this continuation
        self._offset = len(progress.text)  # characters sent before (completions' text_offset)

    def rewrite(self, events: bytes) -> bytes:
        out: list[bytes] = []
        for payload in self._decoder.feed(events):
            if payload == DONE:
                out.append(DONE_EVENT)
                continue
            try:
                chunk: dict[str, Any] = msgspec.json.decode(payload)
            except msgspec.DecodeError:
                continue
            choices = chunk.get("choices") or []
            if chunk.get("usage") is None and all(_role_only(c) for c in choices):
                continue  # the new backend's opening role chunk: the client has one
            chunk["id"], chunk["created"] = self._progress.id, self._progress.created
            for choice in choices:
                self._shift(choice)
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                usage["completion_tokens"] = usage.get("completion_tokens", 0) + self._streamed
                usage["prompt_tokens"] = max(0, usage.get("prompt_tokens", 0) - self._streamed)
            out.append(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
        return b"".join(out)

    def _shift(self, choice: Any) -> None:
        """Completions' `text_offset`s count from the answer's start, not the new prompt's."""
        logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
        if not isinstance(logprobs, dict) or not self._offset:
            return
        offsets = logprobs.get("text_offset")
        if isinstance(offsets, list):
            logprobs["text_offset"] = [
                o + self._offset if isinstance(o, int) else o for o in offsets
            ]


def _role_only(choice: Any) -> bool:
    """An opening chunk: a role, maybe empty content, nothing else (a tool call's head or
    logprobs are not)."""
    if not isinstance(choice, dict) or choice.get("finish_reason") is not None:
        return False
    delta = choice.get("delta")
    if not isinstance(delta, dict) or delta.get("content") or choice.get("logprobs"):
        return False
    return all(key in ("role", "content") or value is None for key, value in delta.items())


class Continuation:
    """Finishes a broken stream on other backends of its pool, or ends it with an error
    event: never silently."""

    def __init__(self, attempts: Attempts, clock: Callable[[], float]) -> None:
        self._attempts = attempts
        self._clock = clock

    async def finish(self, cluster: Cluster, ex: Exchange, broken: Broken) -> None:
        progress = broken.progress
        error: UpstreamError = broken.error
        if ex.routing.endpoint == "responses":  # not continued: upstream/responses_progress.py
            message = f"The stream broke off and could not go on: {error}"
            ex.writer.end(response_error_event(message, error_code(error), progress.events))
            return
        chat = ex.routing.endpoint == "chat"
        refused = ""  # why the last backend picked could not continue it
        for _ in range(cluster.retries.max_attempts - 1):
            plan = plan_continuation(ex.body, chat, progress)
            if plan.way == "done":  # only [DONE] was missing: nothing left to generate
                ex.writer.end(DONE_EVENT)
                return
            if plan.way == "refused":
                message = f"The stream broke off and could not go on: {error}; {plan.why}."
                ex.writer.end(error_event(502, message, "stream_not_resumable"))
                return
            now = self._clock()
            emit = cluster.emit
            state = routed(cluster.router, emit, request_id=ex.request_id,
                           model=ex.model, routing=ex.routing, kind="continuation", now=now,
                           tried=ex.tried)  # fmt: skip
            if state is None:
                break
            ex.tried.append(state)
            if plan.way == "prefill" and state.kind.resume != "continue_final_message":
                plan = plan_continuation(ex.body, chat, progress, state.kind.resume)
                if plan.way == "refused":  # this one's engine cannot: another's may
                    refused = plan.why
                    continue
            refused = ""
            if emit.continued is not None:
                emit.continued(
                    Continued(ex.request_id, now, ex.model, state.backend.id, progress.deltas)
                )
            if plan.way == "prefill":
                again = await self._attempts.resume(
                    ex, state, plan.body, progress, Splicer(progress).rewrite
                )
            else:
                replayer = Replayer(progress)
                again = await self._replay(ex, state, plan.body, progress, replayer)
                if replayer.diverged is not None:
                    message = (
                        "The stream broke off and its replay on another backend differed from "
                        f"what was sent ({replayer.diverged}): the engine does not answer this "
                        "request the same way twice."
                    )
                    ex.writer.end(error_event(502, message, "continuation_diverged"))
                    return
            if again is None:
                return
            error = again
        message = f"The stream broke off and could not go on: {error}"
        if refused:
            message, code = f"{message}; {refused}.", "stream_not_resumable"
        else:
            code = error_code(error)
        ex.writer.end(error_event(502, message, code))

    async def _replay(
        self,
        ex: Exchange,
        state: BackendState,
        body: bytes,
        progress: StreamProgress,
        replayer: Replayer,
    ) -> UpstreamError | None:
        """`resume` with a replay, stopped (the upstream aborted, the attempt ending as
        cancelled: the backend did nothing wrong) as soon as the replay diverges."""
        task = asyncio.ensure_future(
            self._attempts.resume(ex, state, body, progress, replayer.rewrite)
        )

        def stop() -> None:
            task.cancel()

        replayer.on_diverged = stop
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if replayer.diverged is None or (current is not None and current.cancelling()):
                raise  # the client left, or the gateway stops
            return None
