"""Replaying a broken stream: the original request sent again to another backend, its answer
checked against what the client already has, and only the rest passed on.

Continuation uses it where a prefix cannot be handed on (resilience/continuation.py): n > 1,
a tool call under way, a prompt that takes no text appended. It is sound only when the engine
answers the same request the same way (a `seed`, or temperature 0), and even then an engine
may not (batch-variant kernels): so every choice's regenerated text, tool-call names and
arguments, logprobs entries and finish reason are matched against the client's, and what the
client has is swallowed, however the new backend cuts its events (a sent prefix may end
mid-event or mid-arguments); the rest passes with the stream's own id and creation time.
Where the regenerated answer differs from what was sent, `Replayer` stops passing anything,
records why in `diverged` and calls `on_diverged`: the stream ends with an error event, never
with a different answer.

What the client has of a choice is never sent again: its role, a tool call's id, type and name
(a replayed call keeps the first backend's id: engines draw ids at random), its finish reason.
The usage chunk passes as it comes: the new backend generated every token once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from fleetgate.http.sse import SseDecoder
from fleetgate.openai_api import DONE, DONE_EVENT
from fleetgate.upstream.progress import ChoiceProgress, StreamProgress

# Completions' logprobs: four lists, one entry a token.
_LEGACY = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
_EMPTY: tuple[object, ...] = (None, "", [], {})  # values that say nothing


class Diverged(Exception):
    """The replayed answer differs from what the client was sent."""


def _take(have: str, at: int, piece: str, what: str) -> tuple[int, str]:
    """Match `piece` against `have` from `at`: where matching got to, and what is beyond."""
    n = min(len(piece), len(have) - at)
    if piece[:n] != have[at : at + n]:
        raise Diverged(f"{what} differs from what was sent")
    return at + n, piece[n:]


class _SentCall:
    """A tool call the client has, and how much of it the replay has matched."""

    __slots__ = ("arguments", "at", "head", "name", "name_at")

    def __init__(self, name: str, arguments: str) -> None:
        self.name, self.arguments = name, arguments
        self.head = False  # the replay's head of this call has come
        self.name_at = self.at = 0

    def matched(self) -> bool:
        return self.head and self.name_at == len(self.name) and self.at == len(self.arguments)


class _SentChoice:
    """One choice the client has, and how much of it the replay has matched."""

    __slots__ = ("at", "calls", "finish_reason", "logprobs", "logprobs_at", "text")

    def __init__(self, choice: ChoiceProgress) -> None:
        self.text = choice.text
        self.calls = {
            i: _SentCall(c.name, "".join(c.arguments)) for i, c in choice.tool_calls.items()
        }
        self.logprobs = choice.logprobs
        self.finish_reason = choice.finish_reason
        self.at = self.logprobs_at = 0

    def matched(self) -> bool:
        """All of it has come again."""
        return (
            self.at == len(self.text)
            and self.logprobs_at == self.logprobs
            and all(c.matched() for c in self.calls.values())
        )

    def take(self, choice: dict[str, Any], index: int) -> bool:
        """Strip from `choice` (one choice of a replayed chunk) what the client has: True when
        something is left to pass on."""
        left = False
        delta = choice.get("delta")
        if isinstance(delta, dict):
            delta.pop("role", None)
            for key in list(delta):
                value = delta[key]
                if key == "content":
                    rest = self._text(value, index)
                    if rest:
                        delta[key] = rest
                        left = True
                    else:
                        del delta[key]
                elif key == "tool_calls":
                    calls = [c for c in map(self._call, value or ()) if c is not None]
                    if calls:
                        delta[key] = calls
                        left = True
                    else:
                        del delta[key]
                elif value not in _EMPTY:  # a field the progress does not record
                    if not self.matched():
                        raise Diverged(f"choice {index}'s `{key}` cannot be checked")
                    left = True
        text = choice.get("text")
        if isinstance(text, str):
            choice["text"] = rest = self._text(text, index)
            left = left or bool(rest)
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            left = self._logprobs(logprobs) or left
        finish = choice.get("finish_reason")
        if finish is not None and self.finish_reason is not None:
            if finish != self.finish_reason or not self.matched():
                raise Diverged(f"choice {index} ended otherwise than it did")
            choice["finish_reason"] = None  # the client has it
        elif finish is not None:
            left = True
        if left and not self.matched():
            raise Diverged(f"choice {index} goes on otherwise than it did")
        if left and self.finish_reason is not None:
            raise Diverged(f"choice {index} goes on past its end")
        return left

    def _text(self, piece: Any, index: int) -> str:
        if not isinstance(piece, str) or not piece:
            return ""
        self.at, rest = _take(self.text, self.at, piece, f"choice {index}'s text")
        return rest

    def _call(self, delta: Any) -> Any:
        """A tool-call delta less what the client has of it; None if nothing is left."""
        if not isinstance(delta, dict):
            return delta
        call = self.calls.get(delta.get("index", 0))
        if call is None:  # a call the client has none of
            return delta
        function = delta.get("function")
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        if delta.get("id") or delta.get("type") or name:
            call.head = True
            if name:
                call.name_at, beyond = _take(call.name, call.name_at, name, "a tool call's name")
                if beyond:
                    raise Diverged("a tool call's name differs from what was sent")
        arguments = function.get("arguments")
        if not isinstance(arguments, str) or not arguments:
            return None
        call.at, rest = _take(call.arguments, call.at, arguments, "a tool call's arguments")
        return {"index": delta.get("index", 0), "function": {"arguments": rest}} if rest else None

    def _logprobs(self, logprobs: dict[str, Any]) -> bool:
        """Drop the entries the client has (chat's `content`, completions' four lists); True
        when some are left."""
        names = ("content",) if "content" in logprobs else _LEGACY
        entries = logprobs.get(names[0])
        if not isinstance(entries, list):
            return False
        k = min(len(entries), self.logprobs - self.logprobs_at)
        if k:
            self.logprobs_at += k
            for name in names:
                listed = logprobs.get(name)
                if isinstance(listed, list):
                    logprobs[name] = listed[k:]
        return len(entries) > k


class Replayer:
    """Rewrites a replayed stream's SSE events into the rest of the stream the client has (see
    the module docstring)."""

    __slots__ = ("_created", "_decoder", "_id", "_sent", "diverged", "on_diverged")

    def __init__(self, progress: StreamProgress) -> None:
        progress.settle()
        self._decoder = SseDecoder()
        self._id, self._created = progress.id, progress.created
        self._sent = {i: _SentChoice(c) for i, c in progress.choices.items()}
        self.diverged: str | None = None  # why the replay differs from what was sent
        self.on_diverged: Callable[[], None] | None = None  # e.g. stop reading the replay

    def rewrite(self, events: bytes) -> bytes:
        if self.diverged is not None:
            return b""
        out: list[bytes] = []
        try:
            for payload in self._decoder.feed(events):
                if payload == DONE:
                    for index, sent in self._sent.items():
                        if not sent.matched():
                            raise Diverged(f"choice {index} ended before what was sent")
                    out.append(DONE_EVENT)
                    continue
                try:
                    chunk = msgspec.json.decode(payload)
                except msgspec.DecodeError:
                    continue
                if not isinstance(chunk, dict):
                    continue
                choices = chunk.get("choices") or []
                kept = [c for c in choices if self._keep(c)]
                if not kept and chunk.get("usage") is None:
                    continue  # all of it was the client's already
                chunk["choices"] = kept
                chunk["id"], chunk["created"] = self._id, self._created
                out.append(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
        except Diverged as exc:
            self.diverged = str(exc)
            if self.on_diverged is not None:
                self.on_diverged()
        return b"".join(out)

    def _keep(self, choice: Any) -> bool:
        if not isinstance(choice, dict):
            return False
        sent = self._sent.get(choice.get("index", 0))
        return sent is None or sent.take(choice, choice.get("index", 0))
