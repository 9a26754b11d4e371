"""An incremental Server-Sent-Events decoder: bytes as they arrive in, `data` payloads out.

Follows the WHATWG event-stream rules that matter for OpenAI-style streams: lines end in
CRLF, LF or CR; a blank line ends an event; a line starting with ':' is a comment; several
`data:` lines in one event are joined with LF; one space after the colon is dropped; other
fields (event, id, retry) are read past; an event without data is not dispatched.

It runs once per network read on the streaming path, so it works on whole buffers with
`bytes.split`/`find` and never loops over single bytes in Python.
"""

from __future__ import annotations

_BOM = b"\xef\xbb\xbf"


class SseDecoder:
    """Feed it the body chunk by chunk; each `feed` returns the events completed by that chunk."""

    __slots__ = ("_buf", "_cr_pending", "_started")

    def __init__(self) -> None:
        self._buf = b""  # bytes after the last complete event, line endings normalised to LF
        self._cr_pending = False  # the last chunk ended in CR: an LF next is half a CRLF
        self._started = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """The `data` payload of every event that `chunk` completes, in order."""
        if not chunk:
            return []
        if not self._started:
            self._started = True
            if chunk.startswith(_BOM):
                chunk = chunk[len(_BOM) :]
        if self._cr_pending:
            self._cr_pending = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]  # the LF of a CRLF whose CR ended the last chunk
        if b"\r" in chunk:
            # A CR that ends the chunk ends a line now; an LF starting the next one is its pair.
            self._cr_pending = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + chunk if self._buf else chunk
        if b"\n\n" not in buf:
            self._buf = buf
            return []
        blocks = buf.split(b"\n\n")
        self._buf = blocks.pop()
        out: list[bytes] = []
        for block in blocks:
            # The common shape, one `data: ...` line, skips the general field parser.
            if block.startswith(b"data: ") and b"\n" not in block:
                out.append(block[6:])
                continue
            data = _event_data(block)
            if data is not None:
                out.append(data)
        return out


def _event_data(block: bytes) -> bytes | None:
    """The joined `data` lines of one event (its lines without the blank one), or None."""
    parts: list[bytes] = []
    for line in block.split(b"\n"):
        if not line.startswith(b"data"):
            continue  # comments, other fields, and the empty lines of a run of blank lines
        rest = line[4:]
        if not rest:
            parts.append(b"")
        elif rest[0] == 0x3A:  # ':'
            parts.append(rest[2:] if rest[1:2] == b" " else rest[1:])
        # else: a field named e.g. "database", not "data": ignored as unknown
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else b"\n".join(parts)
