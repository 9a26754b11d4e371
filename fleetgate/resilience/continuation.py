"""Continuing a stream on another backend after its backend failed mid-answer.

The relay keeps a `StreamProgress` (upstream/progress.py) of what the client has been sent
(the text, how many tokens, the stream's id). When the backend breaks off,
`continuation_body` asks another backend for the rest: the prompt plus the text already
streamed, with `max_tokens` reduced by what was sent; for chat the partial answer goes in as
an assistant message to continue (vLLM's `continue_final_message`, `add_generation_prompt:
false`), for completions it is appended to the prompt. `Splicer` rewrites the new backend's
events so that the client sees one stream: the same id and creation time, no second role
chunk, usage counting every token.

Requests that cannot be resumed this way (n > 1, prompts given as token ids or batches) get
None, and the client an error event instead. `Continuation` runs the whole step: up to
`max_attempts - 1` backends not tried yet, each asked for the rest of what is still missing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from fleetgate.http.errors import UpstreamError
from fleetgate.http.sse import SseDecoder
from fleetgate.lifecycle.events import Continued, Routed
from fleetgate.openai_api import DONE, DONE_EVENT, error_event
from fleetgate.resilience.cluster import Cluster
from fleetgate.upstream.attempt import Attempts, Broken, Exchange, error_code
from fleetgate.upstream.progress import StreamProgress


def continuation_body(original: bytes, chat: bool, progress: StreamProgress) -> bytes | None:
    """The request that asks another backend for the rest of the answer, or None."""
    progress.settle()
    try:
        body: dict[str, Any] = msgspec.json.decode(original)
    except msgspec.DecodeError:
        return None
    if body.get("n", 1) not in (1, None):
        return None
    for key in ("max_completion_tokens", "max_tokens"):
        limit = body.get(key)
        if isinstance(limit, int):
            if limit - progress.tokens < 1:
                return None
            body[key] = limit - progress.tokens
    min_tokens = body.get("min_tokens")
    if isinstance(min_tokens, int):
        body["min_tokens"] = max(0, min_tokens - progress.tokens)
    text = progress.text
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        body["messages"] = [*messages, {"role": "assistant", "content": text}]
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return None
        body["prompt"] = prompt + text
    body["stream"] = True
    return msgspec.json.encode(body)


class Splicer:
    """Rewrites a continuation's SSE events into the stream the client already has."""

    __slots__ = ("_decoder", "_progress", "_streamed")

    def __init__(self, progress: StreamProgress) -> None:
        progress.settle()
        self._decoder = SseDecoder()
        self._progress = progress
        self._streamed = progress.tokens  # tokens sent before this continuation

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
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                usage["completion_tokens"] = usage.get("completion_tokens", 0) + self._streamed
                usage["prompt_tokens"] = max(0, usage.get("prompt_tokens", 0) - self._streamed)
            out.append(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
        return b"".join(out)


def _role_only(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    return (
        isinstance(delta, dict) and not delta.get("content") and choice.get("finish_reason") is None
    )


class Continuation:
    """Finishes a broken stream on other backends of its pool, or ends it with an error
    event: never silently."""

    def __init__(self, attempts: Attempts, clock: Callable[[], float]) -> None:
        self._attempts = attempts
        self._clock = clock

    async def finish(self, cluster: Cluster, ex: Exchange, broken: Broken) -> None:
        progress = broken.progress
        error: UpstreamError = broken.error
        chat = ex.routing.endpoint == "chat"
        for _ in range(cluster.retries.max_attempts - 1):
            progress.settle()
            if progress.finished:  # only [DONE] was missing: nothing left to generate
                ex.writer.end(DONE_EVENT)
                return
            rest = continuation_body(ex.body, chat, progress)
            if rest is None:
                break
            now = self._clock()
            emit = cluster.emit
            why: dict[str, float] | None = {} if emit.routed is not None else None
            state = cluster.router.pick_other(ex.routing, now, ex.tried, why)
            if emit.routed is not None and why is not None:
                emit.routed(Routed(ex.request_id, now, ex.model, state, "continuation", why))
            if state is None:
                break
            ex.tried.append(state)
            if emit.continued is not None:
                emit.continued(Continued(ex.request_id, now, ex.model, state, progress.tokens))
            again = await self._attempts.resume(
                ex, state, rest, progress, Splicer(progress).rewrite
            )
            if again is None:
                return
            error = again
        message = f"The stream broke off and could not go on: {error}"
        ex.writer.end(error_event(502, message, error_code(error)))
