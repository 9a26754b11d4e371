"""A kept whole answer sent again, and the downstream that keeps one (director/cache.py).

A streaming request answered from the cache gets the answer as the stream an engine would
have sent: per choice its role and whole text in one chunk, then its finish reason; the usage
in a last chunk when the request asked for it (`stream_options.include_usage`); `[DONE]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from fleetgate.lifecycle.downstream import Downstream, Headers

_decode = msgspec.json.Decoder(dict[str, Any]).decode
_encode = msgspec.json.encode
_PER_REQUEST = frozenset((b"x-request-id", b"content-length"))


def as_stream(endpoint: str, body: bytes, include_usage: bool) -> list[bytes]:
    """The SSE events (`data: ...` and a blank line each) of whole answer `body`."""
    answer = _decode(body)
    head: dict[str, Any] = {k: answer[k] for k in ("id", "created", "model") if k in answer}
    chat = endpoint == "chat"
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    events: list[dict[str, Any]] = []
    for choice in answer.get("choices", []):
        index = choice.get("index", 0)
        if chat:
            message = choice.get("message") or {}
            delta = {"role": message.get("role", "assistant"), "content": message.get("content")}
            first = {"index": index, "delta": delta, "finish_reason": None}
            last = {"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}
        else:
            first = {"index": index, "text": choice.get("text", ""), "finish_reason": None}
            last = {"index": index, "text": "", "finish_reason": choice.get("finish_reason")}
        events += [{**head, "choices": [first]}, {**head, "choices": [last]}]
    if include_usage and answer.get("usage") is not None:
        events.append({**head, "choices": [], "usage": answer["usage"]})
    return [b"data: " + _encode(event) + b"\n\n" for event in events] + [b"data: [DONE]\n\n"]


def asks_usage(body: bytes) -> bool:
    """Whether a streaming request asked for its usage in a last chunk."""
    options = _decode(body).get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


class Keeping:
    """The client's downstream, passed through, keeping a whole answer with status 200 (its
    headers less the per-request ones, its body) for the cache; each answer says it was not
    from the cache (`x-fleetgate-cache: miss`)."""

    __slots__ = ("_client", "body", "headers")

    MISS = (b"x-fleetgate-cache", b"miss")

    def __init__(self, client: Downstream) -> None:
        self._client = client
        self.headers: Headers | None = None  # a kept answer's
        self.body = b""

    @property
    def status(self) -> int:
        return self._client.status

    @property
    def disconnected(self) -> bool:
        return self._client.disconnected

    def send(self, status: int, headers: Headers, body: bytes, lines: bytes = b"") -> None:
        if status == 200:
            self.headers = [h for h in headers if h[0] not in _PER_REQUEST]
            self.body = body
        self._client.send(status, [*headers, self.MISS], body, lines)

    def start(self, status: int, headers: Headers, lines: bytes = b"") -> None:
        self._client.start(status, [*headers, self.MISS], lines)

    def write(self, chunk: bytes) -> bool:
        return self._client.write(chunk)

    def when_drained(self, callback: Callable[[], None]) -> None:
        self._client.when_drained(callback)

    def end(self, last: bytes = b"") -> None:
        self._client.end(last)

    def abort(self) -> None:
        self._client.abort()
