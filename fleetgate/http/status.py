"""Status lines, rendered once."""

from __future__ import annotations

from http import HTTPStatus

_LINES: dict[int, bytes] = {s.value: b"%d %b" % (s.value, s.phrase.encode()) for s in HTTPStatus}


def reason_phrase(status: int) -> bytes:
    """`b"200 OK"` for 200; an unknown code gets a bare number, which HTTP/1.1 allows."""
    line = _LINES.get(status)
    return line if line is not None else b"%d " % status
