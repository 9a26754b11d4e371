"""The server side of one response: a whole body, or a chunked stream written piece by piece."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fleetgate.http.status import reason_phrase

_CRLF = b"\r\n"


class ClientDisconnected(Exception):
    """The client closed its connection while the handler was still answering."""


class ClientConnection(Protocol):
    """What a writer needs of the client's connection (http/server.py's)."""

    @property
    def closed(self) -> bool: ...

    @property
    def paused(self) -> bool:
        """The client is not keeping up: the connection's write buffer is over its mark."""

    def write(self, data: bytes) -> None: ...

    def writelines(self, parts: tuple[bytes, bytes]) -> None: ...

    async def drain(self) -> None: ...

    def when_drained(self, callback: Callable[[], None]) -> None: ...

    def abort(self) -> None: ...


class ResponseWriter:
    """Writes one response: either `send` a whole body, or `start`, `write`*, `end` a stream.

    Streams use chunked transfer encoding; for an HTTP/1.0 client (`chunked=False`), which
    cannot read it, a stream's end is the connection's close instead. `write` never blocks; a
    streaming handler calls `drain()` now and then so a slow client pauses it instead of
    growing the buffer.
    """

    __slots__ = (
        "_chunked", "_conn", "_head", "_head_only", "finished", "keep_alive", "started", "status",
    )  # fmt: skip

    def __init__(
        self,
        conn: ClientConnection,
        keep_alive: bool,
        head_only: bool = False,
        chunked: bool = True,
    ) -> None:
        self._conn = conn
        self.keep_alive = keep_alive  # False: the connection closes after this response
        self._head_only = head_only  # a HEAD request: the same head, never a body
        self._chunked = chunked
        self._head = b""  # a streamed response's head, sent with its first chunk
        self.started = False
        self.finished = False
        self.status = 0  # the status sent, once started

    @property
    def disconnected(self) -> bool:
        return self._conn.closed

    @property
    def paused(self) -> bool:
        """True when the client is not keeping up: call `drain()` before writing more."""
        return self._conn.paused

    def _render_head(
        self, status: int, headers: list[tuple[bytes, bytes]], framing: bytes
    ) -> bytes:
        parts = [b"HTTP/1.1 ", reason_phrase(status), _CRLF]
        for name, value in headers:
            parts += (name, b": ", value, _CRLF)
        parts.append(framing)
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(_CRLF)
        return b"".join(parts)

    def send(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, lines: bytes = b""
    ) -> None:
        """Send a complete response with a content-length; `lines`: more headers, rendered
        (`name: value\r\n` each)."""
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.finished = True
        self.status = status
        framing = b"%bcontent-length: %d\r\n" % (lines, len(body))
        head = self._render_head(status, headers, framing)
        if self._head_only or not body:
            self._conn.write(head)
        elif len(body) < 65536:
            self._conn.write(head + body)  # one copy of a small body beats a second syscall
        else:
            self._conn.writelines((head, body))

    def start(self, status: int, headers: list[tuple[bytes, bytes]], lines: bytes = b"") -> None:
        """Send the status line and headers of a chunked (streamed) response; `lines` as for
        `send`."""
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.status = status
        if self._chunked:
            framing = lines + b"transfer-encoding: chunked\r\n"
        else:
            framing = lines
            self.keep_alive = False  # the close is what tells the client the stream ended
        # Held back until the first chunk so both leave in one packet (one syscall fewer).
        self._head = self._render_head(status, headers, framing)

    def write(self, chunk: bytes) -> bool:
        """Send one chunk of a streamed response; an empty chunk is skipped (it would end it).
        False when the client is not keeping up (as `paused`): wait before writing more."""
        conn = self._conn
        if chunk and not self.finished:
            if self._chunked:
                conn.write(b"%b%x\r\n%b\r\n" % (self._head, len(chunk), chunk))
            else:
                conn.write(self._head + chunk)
            self._head = b""
        return not conn.paused

    async def drain(self) -> None:
        """Wait while the client is slower than the handler; raise if the client went away."""
        await self._conn.drain()

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the client has caught up (at once if it has); for relays that
        pause their source instead of awaiting `drain()`."""
        self._conn.when_drained(callback)

    def end(self, last: bytes = b"") -> None:
        """Finish a streamed response, sending `last` as its final chunk in the same write."""
        if not self.finished:
            self.finished = True
            if not self._chunked:
                self._conn.write(self._head + last)  # the server then closes the connection
            elif last:
                self._conn.write(b"%b%x\r\n%b\r\n0\r\n\r\n" % (self._head, len(last), last))
            else:
                self._conn.write(self._head + b"0\r\n\r\n")
            self._head = b""

    def abort(self) -> None:
        """Cut the connection at once, mid-response: what a crashed server looks like."""
        self._conn.abort()
