"""What a Responses API stream (`POST /v1/responses`, `stream: true`) has delivered so far.

Its events are typed (`event: response.output_text.delta` + `data: {...}`) and it has no
[DONE]: it is complete once a terminal event has gone out (`response.completed`,
`response.incomplete`, `response.failed`, or an `error`). The terminal event's `usage`, when
it has one, is what the request used; until then, or without one, the text deltas' length
gives the estimate (upstream/progress.py), read as they pass without decoding them. Such a
stream is not continued on another backend: a Response is built from items the engine
numbers and stores, which another engine cannot take up half way; one that breaks off ends
with an `error` event instead.
"""

from __future__ import annotations

import re

import msgspec

from fleetgate.openai_api import Usage, in_tokens
from fleetgate.upstream.progress import StreamProgress

_TERMINAL = re.compile(rb"(?:^|\n)event: ?(?:response\.(?:completed|incomplete|failed)|error)\r?\n")
_DELTA = b"event: response.output_text.delta"
_DELTA_TEXT = re.compile(rb'"delta":\s*"((?:[^"\\]|\\.)*)"')  # a text delta's, JSON-escaped
_ID = re.compile(rb'"id":\s*"(resp_[^"]{1,200})"')  # the response's, in its first event


class _Response(msgspec.Struct):
    usage: Usage | None = None


class _Terminal(msgspec.Struct):
    response: _Response | None = None


_decode_terminal = msgspec.json.Decoder(_Terminal).decode


class ResponsesProgress(StreamProgress):
    """A StreamProgress for a Responses API stream: `done` at its terminal event, `reported`
    the usage its terminal event gave."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        super().__init__()
        self._last = b""  # the terminal event's payload, decoded once asked for

    @property
    def finished(self) -> bool:
        return self.done

    def feed(self, events: bytes) -> None:
        if not self.events and (named := _ID.search(events)) is not None:  # the first read
            self.id = named.group(1).decode("latin-1")  # where a follow-up must go: its id
        self.events += events.count(b"\ndata:") + events.startswith(b"data:")
        if _DELTA in events:
            self.deltas += events.count(_DELTA)
            self._text_bytes += sum(len(m) for m in _DELTA_TEXT.findall(events))
        found = _TERMINAL.search(events)
        if found is not None:
            self.done = True
            start = events.find(b"data:", found.end())
            end = events.find(b"\n", start)
            self._last = events[start + 5 : end if end >= 0 else len(events)].strip()

    def settle(self) -> None:
        if self._last:
            try:
                terminal = _decode_terminal(self._last)
            except msgspec.DecodeError:
                terminal = _Terminal()
            self._last = b""
            if terminal.response is not None:
                self.reported = in_tokens(terminal.response.usage)
