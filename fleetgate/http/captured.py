"""A response writer that keeps the answer instead of sending it: for requests the gateway
makes of itself (the batch runner's, through `Gateway.serve_as`)."""

from __future__ import annotations

from collections.abc import Callable

from fleetgate.http.writer import ResponseWriter


class Nowhere:
    """A client connection that is never there to write to, and never pushes back."""

    closed = False
    paused = False

    def write(self, data: bytes) -> None:
        pass

    def writelines(self, parts: tuple[bytes, bytes]) -> None:
        pass

    async def drain(self) -> None:
        pass

    def when_drained(self, callback: Callable[[], None]) -> None:
        callback()

    def abort(self) -> None:
        pass


_NOWHERE = Nowhere()


class CapturedResponse(ResponseWriter):
    """The status, headers and body of one answer, whole or streamed, kept in memory."""

    __slots__ = ("_parts", "headers")

    def __init__(self) -> None:
        super().__init__(_NOWHERE, keep_alive=True)
        self.headers: list[tuple[bytes, bytes]] = []
        self._parts: list[bytes] = []

    @property
    def body(self) -> bytes:
        return b"".join(self._parts)

    def header(self, name: bytes) -> bytes | None:
        """The last value of header `name` (lower case), or None."""
        for key, value in reversed(self.headers):
            if key.lower() == name:
                return value
        return None

    def send(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, lines: bytes = b""
    ) -> None:
        self.start(status, headers, lines)
        self.end(body)

    def start(self, status: int, headers: list[tuple[bytes, bytes]], lines: bytes = b"") -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.status = status
        self.headers = list(headers)

    def write(self, chunk: bytes) -> bool:
        if chunk and not self.finished:
            self._parts.append(chunk)
        return True

    def end(self, last: bytes = b"") -> None:
        if not self.finished:
            self.finished = True
            if last:
                self._parts.append(last)
