"""An upstream's response whose head has arrived: its body comes through `chunks()`, `read()`
or, fastest, `relay()`, which hands each piece to a sink from the socket's own callback."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from fleetgate.http.errors import ReadError, UpstreamError


class RelaySink(Protocol):
    """Where `UpstreamResponse.relay` hands a body, from the socket's own callback: the pieces
    of one read are appended to `pending`, then `flush()` passes them on."""

    pending: list[bytes]

    def flush(self) -> None:
        """The end of one read from the socket: pass on (and clear) `pending`, in one go."""


class UpstreamConnection(Protocol):
    """What a response needs of the connection that carries it (http/client.py's)."""

    loop: asyncio.AbstractEventLoop
    sink: RelaySink | None  # while `relay` runs: the connection's parser feeds it directly

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def set_body_deadlines(
        self, delay_s: float, message: str, idle_s: float | None, idle_message: str
    ) -> None: ...

    def abort(self) -> None: ...


_READ_HIGH_WATER = 1024 * 1024  # pause the socket when this much body is unread


class UpstreamResponse:
    """A response whose headers have arrived; its body arrives through `chunks()` or `read()`."""

    __slots__ = (
        "_buffered", "_chunks", "_conn", "_done", "_error", "_waiter", "headers", "status",
    )  # fmt: skip

    def __init__(self, conn: UpstreamConnection) -> None:
        self._conn = conn
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._done = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None

    def header(self, name: bytes) -> bytes | None:
        """The value of a header (lower-case name), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def read(self) -> bytes:
        """The whole body."""
        if not self._done:  # still arriving, or broken off: read it as it comes
            parts = [chunk async for chunk in self.chunks()]
            return parts[0] if len(parts) == 1 else b"".join(parts)
        chunks = self._chunks  # all here already (a small answer: the common case)
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        return body

    def chunks(self) -> UpstreamResponse:
        return self

    def __aiter__(self) -> UpstreamResponse:
        return self

    async def __anext__(self) -> bytes:
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._buffered < _READ_HIGH_WATER:
                    self.resume_reading()
                return chunk
            if self._error is not None:
                raise self._error
            if self._done:
                raise StopAsyncIteration
            await self._wait()

    async def _wait(self) -> None:
        """Until the connection feeds, finishes or fails this response; cancelling aborts it."""
        waiter = self._conn.loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        except asyncio.CancelledError:
            self.close()
            raise

    async def relay(self, sink: RelaySink) -> None:
        """Hand every body chunk to `sink` as it arrives, from the socket's own callback (no task
        switch per chunk), with a flush after each read; return when the body has ended, raise
        `UpstreamError` if it broke.

        The fastest way to pass a stream on: when one read brings several chunks (a busy
        gateway), the sink can pass them on in one write. A sink that cannot keep up calls
        `pause_reading()` and later `resume_reading()`.
        """
        if self._chunks:
            sink.pending.extend(self._chunks)
            self._chunks.clear()
            self._buffered = 0
            self.resume_reading()  # had the body reached the high-water mark before the relay
            sink.flush()
        if not self._ended():  # else the connection is no longer this response's
            conn = self._conn
            conn.sink = sink  # the connection's parser appends to it directly: the hot path
            try:
                while not self._ended():
                    await self._wait()
            finally:
                if conn.sink is sink:
                    conn.sink = None
        if self._error is not None:
            raise self._error

    def _ended(self) -> bool:
        return self._done or self._error is not None

    def pause_reading(self) -> None:
        if not self._ended():  # once done, the connection is not ours
            self._conn.pause_reading()

    def resume_reading(self) -> None:
        if not self._ended():
            self._conn.resume_reading()

    def expire_in(
        self, delay_s: float, message: str, idle_s: float | None = None, idle_message: str = ""
    ) -> None:
        """Fail with `UpstreamTimeout(message)` and abort unless the body ends within delay_s,
        or with `UpstreamTimeout(idle_message)` if `idle_s` pass without a byte of it (time
        spent paused because the gateway's own client is slow does not count)."""
        if not self._ended():
            self._conn.set_body_deadlines(delay_s, message, idle_s, idle_message)

    def close(self) -> None:
        """Stop reading; an unfinished response aborts its connection (that cancels upstream)."""
        if not self._ended():
            self._fail(ReadError("response abandoned by the gateway"))
            self._conn.abort()

    # -- fed by the connection --------------------------------------------------------------

    def _feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered >= _READ_HIGH_WATER:
            self._conn.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if not self._ended():  # the first cause is the one to report
            self._error = error
            self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
