"""What one stream has delivered to its client so far, choice by choice: the text, the tool
calls (id, name, arguments so far), how many logprobs entries, the finish reason; and the
stream's id, its tokens and whether it is complete. Continuation (resilience/continuation.py)
reads it to ask another backend for the rest, or to check a replayed answer against what the
client already has (resilience/replay.py).

A stream's tokens are what the answer says, never how many events carried it: the engine's
`usage` when it sent one (stream_options.include_usage), else its text and tool-call
arguments by the estimate prompts are counted with (bytes / 4, routing/base.py), so a
transport that reports a stream in a few events counts it the same as one event a token.
`deltas` (the pieces of text or arguments sent) is what continuation takes off a request's
`max_tokens`: one token each from a streaming engine."""

from __future__ import annotations

import msgspec

from fleetgate.openai_api import Usage, in_tokens
from fleetgate.routing.base import BYTES_PER_TOKEN

_DONE = b"[DONE]"
_LAST = b"data: [DONE]\n\n"


class _Function(msgspec.Struct, gc=False):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct, gc=False):
    index: int = 0
    id: str | None = None
    type: str | None = None
    function: _Function | None = None


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Logprobs(msgspec.Struct, gc=False):
    # Entries are counted, not read: msgspec skips over each without building it.
    content: list[msgspec.Raw] | None = None  # chat: one entry a token
    tokens: list[msgspec.Raw] | None = None  # completions: one a token


class _Choice(msgspec.Struct, gc=False):
    index: int = 0
    delta: _Delta | None = None
    text: str | None = None
    logprobs: _Logprobs | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct, gc=False):
    id: str = ""
    created: int = 0
    choices: list[_Choice] = []
    usage: Usage | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_decode_batch = msgspec.json.Decoder(list[_Chunk]).decode
_BATCH = 64  # events recorded before they are decoded


class ToolCallProgress:
    """One tool call of a choice as the client has it: the head, and the arguments so far."""

    __slots__ = ("arguments", "id", "name", "type")

    def __init__(self) -> None:
        self.id = ""
        self.type = ""
        self.name = ""
        self.arguments: list[str] = []  # the pieces as sent


class ChoiceProgress:
    """One choice (by its `index`) as the client has it."""

    __slots__ = ("finish_reason", "logprobs", "parts", "tool_calls")

    def __init__(self) -> None:
        self.parts: list[str] = []  # the text's pieces as sent (completions: the echo too)
        self.tool_calls: dict[int, ToolCallProgress] = {}  # by the call's index
        self.logprobs = 0  # logprobs entries sent (one a token)
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)


class StreamProgress:
    """What one stream has delivered to its client so far.

    Recording is cheap because it is lazy: events are kept as the bytes that were sent and
    decoded in batches (one msgspec call per batch, when 64 have gathered or when a
    continuation needs the text), not one by one on the relay's hot path.
    """

    __slots__ = (
        "_raw", "_text_bytes", "choices", "created", "deltas", "done", "events", "id", "reported",
    )  # fmt: skip

    def __init__(self) -> None:
        self._raw: list[bytes] = []  # whole SSE events as sent, not decoded yet
        self.id = ""
        self.created = 0
        self.choices: dict[int, ChoiceProgress] = {}  # by index, in the order they came
        # Deltas that carried text or tool-call arguments, all choices together: one token each
        # from a streaming engine (what continuation takes off `max_tokens`).
        self.deltas = 0
        self._text_bytes = 0  # of that text and those arguments (ASCII: characters), decoded
        # Data events sent, [DONE] aside: counted as they pass, without decoding, for the
        # latency stats (a stream that ends without a failure is never decoded at all).
        self.events = 0
        self.done = False  # [DONE] was sent
        self.reported: Usage | None = None  # the `usage` sent, if any

    @property
    def tokens(self) -> int:
        """The output tokens sent so far (call `settle` first): the engine's count when it
        reported one, else the estimate from the text (see the module docstring)."""
        if self.reported is not None:
            return self.reported.completion_tokens
        return -(-self._text_bytes // BYTES_PER_TOKEN)

    @property
    def text(self) -> str:
        """The first choice's text (the only one's, unless n > 1)."""
        self.settle()
        choice = self.choices.get(0)
        return "" if choice is None else choice.text

    @property
    def finished(self) -> bool:
        """Every choice sent so far has had its finish reason (call `settle` first)."""
        choices = self.choices
        return bool(choices) and all(c.finish_reason is not None for c in choices.values())

    @property
    def tool_calls(self) -> bool:
        """A tool call was sent, in any choice (call `settle` first)."""
        return any(c.tool_calls for c in self.choices.values())

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
        """Decode what has been recorded so far (`choices`, `tokens`, `id` need it)."""
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
        choices = self.choices
        deltas = size = 0
        at, got = -1, ChoiceProgress()  # the choice of the last delta: most often the next's
        for chunk in chunks:
            if chunk.usage is not None:
                self.reported = in_tokens(chunk.usage)
            for choice in chunk.choices:
                if choice.index != at:
                    at = choice.index
                    if (known := choices.get(at)) is None:
                        known = choices[at] = ChoiceProgress()
                    got = known
                delta = choice.delta
                if delta is None:
                    piece = choice.text
                else:
                    piece = delta.content
                    if delta.tool_calls:
                        calls, length = _record_calls(got.tool_calls, delta.tool_calls)
                        deltas += calls
                        size += length
                if piece:
                    got.parts.append(piece)
                    deltas += 1
                    size += len(piece)
                logprobs = choice.logprobs
                if logprobs is not None:
                    entries = logprobs.content if logprobs.content is not None else logprobs.tokens
                    got.logprobs += len(entries or ())
                if choice.finish_reason is not None:
                    got.finish_reason = choice.finish_reason
        self.deltas += deltas
        self._text_bytes += size


def _record_calls(calls: dict[int, ToolCallProgress], deltas: list[_ToolCall]) -> tuple[int, int]:
    """Add tool-call deltas to a choice's calls; the deltas that carried arguments, and the
    arguments' length."""
    count = size = 0
    for delta in deltas:
        call = calls.get(delta.index)
        if call is None:
            call = calls[delta.index] = ToolCallProgress()
        if delta.id:
            call.id += delta.id  # accumulated as clients do (openai's accumulate_delta)
        if delta.type:
            call.type = delta.type
        function = delta.function
        if function is not None:
            if function.name:
                call.name += function.name  # a name may come in pieces, as arguments do
            if function.arguments:
                call.arguments.append(function.arguments)
                count += 1
                size += len(function.arguments)
    return count, size


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
