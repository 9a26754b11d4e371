"""POST /fleet/heartbeat {"backend": ID}: where workers in heartbeat mode say they are alive.

Served only when some pool's health check is of kind `heartbeat`. An unknown backend gets a
404 naming it, so a misconfigured worker finds out at once.
"""

from __future__ import annotations

import msgspec

from fleetgate.health.active import ActiveChecker
from fleetgate.http.server import Request
from fleetgate.http.writer import ResponseWriter
from fleetgate.openai_api import error_body

_JSON = b"application/json"


class _Beat(msgspec.Struct):
    backend: str


class HeartbeatEndpoint:
    def __init__(self, checker: ActiveChecker) -> None:
        self._checker = checker

    async def beat(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        headers = [(b"content-type", _JSON), (b"x-request-id", request_id)]
        try:
            beat = msgspec.json.decode(request.body, type=_Beat)
        except msgspec.DecodeError as exc:
            message = f'Send {{"backend": "host:port"}}: {exc}'
            writer.send(400, headers, error_body(400, message, "backend"))
            return
        if not self._checker.beat(beat.backend):
            message = f"No pool expects heartbeats from {beat.backend!r}."
            writer.send(404, headers, error_body(404, message, "backend"))
            return
        writer.send(200, headers, b'{"ok":true}')
