"""OpenAI response bodies as the sim worker sends them: whole responses and stream chunks.

Stream chunks are rendered from byte templates made once per request, because the worker
writes one per token per stream and that loop is what limits how many streams a core serves.
Filler tokens are plain ASCII words, so they need no JSON escaping.
"""

from __future__ import annotations

from typing import Any

import msgspec

_encode = msgspec.json.encode


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(
        prompt_tokens,
        completion_tokens,
        prompt_tokens + completion_tokens,
        {"cached_tokens": cached_tokens},
    )


class StreamFormat:
    """Renders the SSE chunks of one streamed chat or text completion."""

    __slots__ = ("_done_tail", "_head", "_mid", "_tail", "chat", "head_fields")

    def __init__(self, chat: bool, request_id: str, created: int, model: str) -> None:
        self.chat = chat
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head_fields = (
            f'{{"id":"{request_id}","object":"{obj}","created":{created},'
            f'"model":{_encode(model).decode()},"choices":['
        ).encode()
        self._head = b"data: " + self.head_fields
        if chat:
            self._mid = b'{"index":0,"delta":{"content":"'
            self._tail = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self._mid = b'{"index":0,"text":"'
            self._tail = b'","logprobs":null,"finish_reason":null}]}\n\n'
        self._done_tail = b"}]}\n\n"

    def role(self) -> bytes:
        """The first chat chunk, which carries the assistant role and no text."""
        return self._head + b'{"index":0,"delta":{"role":"assistant","content":""},' \
            b'"logprobs":null,"finish_reason":null}]}\n\n'  # fmt: skip

    def token(self, text: str) -> bytes:
        return b"".join((self._head, self._mid, text.encode(), self._tail))

    def finish(self, reason: str) -> bytes:
        delta = b'"delta":{}' if self.chat else b'"text":""'
        return b"".join(
            (self._head, b'{"index":0,', delta, b',"logprobs":null,"finish_reason":"',
             reason.encode(), b'"', self._done_tail)
        )  # fmt: skip

    def usage(self, u: Usage) -> bytes:
        return b"".join((self._head, b'],"usage":', _encode(u), b"}\n\n"))


def full_response(
    chat: bool,
    request_id: str,
    created: int,
    model: str,
    text: str,
    reason: str,
    u: Usage,
    kv_transfer_params: dict[str, Any] | None = None,
) -> bytes:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": u,
    }
    if kv_transfer_params is not None:  # a prefill for a remote decode (vLLM's protocol)
        body["kv_transfer_params"] = kv_transfer_params
    return _encode(body)
