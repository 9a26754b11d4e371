"""What a request's lifecycle writes its answer to: the client, whoever it is. The server's
`ResponseWriter` (http/writer.py) is one, on a real connection; `Sink` keeps the answer in
memory, for the batch runner's requests, tests and the simulator.

An answer is either whole (`send`) or a stream (`start`, `write`*, `end`); `abort` cuts it
mid-way. `lines` are more header lines, already rendered (`name: value\\r\\n` each), as the
front door formats its rate-limit headers once. A stream's `write` says whether the client
keeps up: on False the writer stops reading its source and asks `when_drained` to resume.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

Headers = list[tuple[bytes, bytes]]


class Downstream(Protocol):
    """The client of one request, as the lifecycle sees it."""

    @property
    def status(self) -> int:
        """The status sent, once the answer has started (0 before)."""
        ...

    @property
    def disconnected(self) -> bool:
        """Whether the client has gone (nothing written reaches it any more)."""
        ...

    def send(self, status: int, headers: Headers, body: bytes, lines: bytes = b"") -> None:
        """The whole answer at once."""

    def start(self, status: int, headers: Headers, lines: bytes = b"") -> None:
        """A stream's status and headers."""

    def write(self, chunk: bytes) -> bool:
        """One piece of a stream; False when the client is not keeping up."""
        ...

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the client has caught up (at once if it has)."""

    def end(self, last: bytes = b"") -> None:
        """The stream's end, `last` its final piece."""

    def abort(self) -> None:
        """Cut the answer off mid-way, as a crashed server would."""


class Sink:
    """A downstream that keeps the answer: its status, headers and body, whole or streamed.
    It always keeps up; `aborted` says whether the answer was cut off."""

    __slots__ = ("_parts", "aborted", "finished", "headers", "started", "status")

    def __init__(self) -> None:
        self.status = 0
        self.headers: Headers = []
        self._parts: list[bytes] = []
        self.started = False
        self.finished = False
        self.aborted = False

    @property
    def disconnected(self) -> bool:
        return self.aborted

    @property
    def body(self) -> bytes:
        return b"".join(self._parts)

    @property
    def chunks(self) -> list[bytes]:
        """A stream's pieces as they were written (one for a whole answer)."""
        return list(self._parts)

    def header(self, name: bytes) -> bytes | None:
        """The last value of header `name` (lower case), or None."""
        for key, value in reversed(self.headers):
            if key.lower() == name:
                return value
        return None

    def send(self, status: int, headers: Headers, body: bytes, lines: bytes = b"") -> None:
        self.start(status, headers, lines)
        self.end(body)

    def start(self, status: int, headers: Headers, lines: bytes = b"") -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.status = status
        self.headers = [*headers, *_parse_lines(lines)]

    def write(self, chunk: bytes) -> bool:
        if chunk and not self.finished:
            self._parts.append(chunk)
        return True

    def when_drained(self, callback: Callable[[], None]) -> None:
        callback()

    def end(self, last: bytes = b"") -> None:
        if not self.finished:
            self.finished = True
            if last:
                self._parts.append(last)

    def abort(self) -> None:
        self.aborted = self.finished = True


def _parse_lines(lines: bytes) -> Headers:
    pairs = (line.partition(b": ") for line in lines.split(b"\r\n") if line)
    return [(name.lower(), value) for name, _, value in pairs]
