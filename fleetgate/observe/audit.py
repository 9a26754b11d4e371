"""The audit log: one JSON line per operator action and per failed authentication, appended
to a file (`server.audit_log`), never rewritten.

    {"time": "2026-11-25T21:50:02.120Z", "event": "admin_drain", "key": "3f9c0b1e2d4a5f60",
     "backend": "10.0.0.5:8000", "draining": true, "request_id": "a1b2c3-9"}
    {"time": "...", "event": "auth_failed", "reason": "invalid_api_key", "request_id": "..."}

A key is named by the first 16 hex digits of its SHA-256 (the id the gateway keys its limits
by), never by the key. No prompt or answer text is ever written here. Each line is written
with one `write` on a file opened for appending, and the file is opened per line, so an
outside rotation (logrotate's move and create) needs no signal.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from fleetgate.lifecycle.events import Rejected
from fleetgate.lifecycle.hooks import Hooks

_AUTH_REASONS = frozenset({"invalid_api_key", "model_not_allowed"})
# Failed authentications written per second at most: anyone can send bad keys, and each line
# is a file append on the event loop. What is left out is counted in the next line written.
FAILURES_PER_S = 20
_encode = msgspec.json.Encoder().encode


def key_id(key: bytes | None) -> str | None:
    """How the log names a key: the first 16 hex digits of its SHA-256."""
    return None if key is None else hashlib.sha256(key).hexdigest()[:16]


class AuditLog:
    def __init__(self, path: str | Path, wall_clock: Callable[[], float] = time.time) -> None:
        self._path = os.fspath(path)
        self._wall = wall_clock
        self._second = -1  # the whole second of the wall clock failures are counted in
        self._failures = 0  # written in it
        self._suppressed = 0  # not written since the last one that was
        Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        self.record("audit_log_opened")  # fails at start, not at the first event, if unwritable

    def subscribe(self, hooks: Hooks) -> None:
        """Hear the edge's refusals: failed authentications and forbidden models."""
        hooks.subscribe(Rejected, self.on_rejected)

    def on_rejected(self, event: Rejected) -> None:
        if event.reason in _AUTH_REASONS:
            self.auth_failed(
                reason=event.reason, tenant=event.tenant or None,
                request_id=event.request_id.decode("latin-1"),
            )  # fmt: skip

    def auth_failed(self, **fields: Any) -> None:
        """A failed authentication: written unless FAILURES_PER_S have been this second."""
        second = int(self._wall())
        if second != self._second:
            self._second, self._failures = second, 0
        if self._failures >= FAILURES_PER_S:
            self._suppressed += 1
            return
        self._failures += 1
        if self._suppressed:
            fields["suppressed_before"] = self._suppressed
            self._suppressed = 0
        self.record("auth_failed", **fields)

    def record(self, event: str, **fields: Any) -> None:
        now = self._wall()
        stamp = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
        )
        line = _encode({"time": stamp, "event": event, **fields}) + b"\n"
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
