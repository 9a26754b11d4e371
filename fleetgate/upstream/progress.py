"""What one stream has delivered to its client so far: the text, the tokens, the stream's id,
and whether it is complete. Continuation (resilience/continuation.py) reads it to ask another
backend for the rest."""

from __future__ import annotations

import msgspec

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
