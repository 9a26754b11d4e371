"""Continuing a stream on another backend after its backend failed mid-answer.

The relay keeps a `StreamProgress` of what the client has been sent (the text, how many
tokens, the stream's id). When the backend breaks off, `continuation_body` asks another
backend for the rest: the prompt plus the text already streamed, with `max_tokens` reduced by
what was sent; for chat the partial answer goes in as an assistant message to continue
(vLLM's `continue_final_message`, `add_generation_prompt: false`), for completions it is
appended to the prompt. `Splicer` rewrites the new backend's events so that the client sees
one stream: the same id and creation time, no second role chunk, usage counting every token.

Requests that cannot be resumed this way (n > 1, prompts given as token ids or batches) get
None, and the client an error event instead.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fleetgate.http.sse import SseDecoder

_DONE = b"[DONE]"
_LAST = b"data: [DONE]\n\n"


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    id: str = ""
    created: int = 0
    choices: list[_Choice] = []


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_decode_batch = msgspec.json.Decoder(list[_Chunk]).decode
_BATCH = 64  # events recorded before they are decoded


class StreamProgress:
    """What one stream has delivered to its client so far.

    Recording is cheap because it is lazy: events are kept as the bytes that were sent and
    decoded in batches (one msgspec call per batch, when 64 have gathered or when a
    continuation needs the text), not one by one on the relay's hot path.
    """

    __slots__ = ("_raw", "created", "done", "events", "finished", "id", "parts", "tokens")

    def __init__(self) -> None:
        self._raw: list[bytes] = []  # whole SSE events as sent, not decoded yet
        self.id = ""
        self.created = 0
        self.parts: list[str] = []
        self.tokens = 0  # events that carried text: one token each from a streaming engine
        # Data events sent, [DONE] aside: counted as they pass, without decoding, for the
        # latency stats (a stream that ends without a failure is never decoded at all).
        self.events = 0
        self.finished = False  # a finish_reason was sent: the answer is complete
        self.done = False  # [DONE] was sent

    @property
    def text(self) -> str:
        self.settle()
        return "".join(self.parts)

    def feed(self, events: bytes) -> None:
        """Record complete SSE events as sent to the client."""
        count = events.count(b"\ndata:") + events.startswith(b"data:")
        if events.endswith((b"data: [DONE]\n\n", b"data: [DONE]\r\n\r\n")):
            self.done = True
            count -= 1
        self.events += count
        self._raw.append(events)
        if len(self._raw) >= _BATCH:
            self.settle()

    def settle(self) -> None:
        """Decode what has been recorded so far (`text`, `tokens`, `id` need it)."""
        if not self._raw:
            return
        raw = b"".join(self._raw)
        self._raw = []
        if b"\r" in raw:
            raw = raw.replace(b"\r\n", b"\n")
        if raw.endswith(_LAST):
            raw = raw[: -len(_LAST)]
        if not raw:
            return
        try:
            chunks = _decode_batch(_as_array(raw))
        except msgspec.DecodeError:  # not plain `data: {...}` events: take them one by one
            chunks = _decode_each(raw)
        if chunks and not self.id:
            self.id, self.created = chunks[0].id, chunks[0].created
        parts = self.parts
        before = len(parts)
        for chunk in chunks:
            for choice in chunk.choices:
                delta = choice.delta
                piece = delta.content if delta is not None else choice.text
                if piece:
                    parts.append(piece)
                if choice.finish_reason is not None:
                    self.finished = True
        self.tokens += len(parts) - before


def _as_array(events: bytes) -> bytes:
    """`data: A\n\ndata: B\n\n` as the JSON array `[A,B]`, by two byte replacements.

    A JSON payload holds no raw newline, so `\n\ndata: ` only ever separates events; anything
    else in the stream (a comment, an `event:` line, a multi-line payload) leaves the result
    invalid JSON, and the caller falls back to `_decode_each`."""
    if not events.startswith(b"data: "):
        return b""
    return b"[" + events[6:].rstrip(b"\n").replace(b"\n\ndata: ", b",") + b"]"


def _decode_each(events: bytes) -> list[_Chunk]:
    """The data events one by one, skipping comments, other fields, [DONE] and bad JSON."""
    chunks = []
    for event in events.split(b"\n\n"):
        if event.startswith(b"data: ") and event[6:] != _DONE:
            try:
                chunks.append(_decode_chunk(event[6:]))
            except msgspec.DecodeError:
                continue
    return chunks


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
            if payload == _DONE:
                out.append(b"data: [DONE]\n\n")
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
