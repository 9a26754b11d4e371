"""Relaying a stream: upstream SSE events to the client, whole events only, one write per read."""

from __future__ import annotations

from collections.abc import Callable

from fleetgate.http.transport import UpstreamAnswer
from fleetgate.lifecycle.downstream import Downstream
from fleetgate.upstream.progress import StreamProgress


class StreamRelay:
    """Passes upstream events straight to the client, from the socket callback: the events of
    one read leave in one write (when the gateway is busy, reads bring several).

    Only whole SSE events are passed on (a partial one waits for its end), so a continuation
    can follow cleanly; each is recorded in the stream's progress. Before the first event goes
    out, `start` is called: it claims the client (hedging) and sends the response head; if it
    says no, another attempt has the client and this relay passes nothing on. When the client
    falls behind, the upstream socket is paused until it catches up.
    """

    __slots__ = (
        "_clock", "_held", "_lost", "_progress", "_response", "_rewrite", "_start", "_writer",
        "first_at", "pending",
    )  # fmt: skip

    def __init__(
        self,
        writer: Downstream,
        response: UpstreamAnswer,
        clock: Callable[[], float],
        progress: StreamProgress,
        rewrite: Callable[[bytes], bytes] | None,
        start: Callable[[], bool],
    ) -> None:
        self._writer = writer
        self._start = start
        self._lost = False
        self._response = response
        self._clock = clock
        self._progress = progress
        self._rewrite = rewrite
        self.pending: list[bytes] = []  # the pieces of the current read, appended by the parser
        self._held = b""  # the start of an event whose end has not come yet
        self.first_at: float | None = None

    def flush(self) -> None:
        pending = self.pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        if self._lost:
            return
        if self._held:
            data = self._held + data
        if data.endswith(b"\n\n"):  # the usual case: whole events only
            self._held = b""
        else:
            cut = max(data.rfind(b"\n\n") + 2, data.rfind(b"\r\n\r\n") + 4, 0)
            self._held = data[cut:]
            data = data[:cut]
        if not data:
            return
        if self._rewrite is not None:
            data = self._rewrite(data)
            if not data:
                return
        if self.first_at is None:
            if not self._start():
                self._lost = True  # another attempt answers this client
                return
            self.first_at = self._clock()
        progress = self._progress
        progress.feed(data)
        writer = self._writer
        if progress.done:  # the stream's last event: end it in the same write
            writer.end(data)
            return
        if not writer.write(data):  # the client is not keeping up
            self._response.pause_reading()
            writer.when_drained(self._response.resume_reading)
