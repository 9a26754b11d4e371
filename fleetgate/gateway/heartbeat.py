"""POST /fleet/heartbeat {"backend": ID, "gpu": [reading, ...]?}: where workers in heartbeat
mode say they are alive, and GPU agents (`fleetgate worker gpu-agent`) bring their readings.

Served when some pool's health check is of kind `heartbeat` or some pool has `gpu.enabled`;
behind the heartbeat key when auth is on (gateway/app.py). A beat counts for the pools that
expect heartbeats from that backend; its `gpu` readings, when it has them, go to the pools
that take them (health/gpu.py), whatever their health check: the agent beside an engine that
is checked over HTTP is the common case. A backend that no pool expects this from gets a 404
naming it, and a malformed beat a 400 naming the field, so a misconfigured worker finds out
at once; nothing of a refused beat is kept.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from fleetgate.fleet.gpu import GpuReadings
from fleetgate.health.active import ActiveChecker
from fleetgate.health.gpu import GpuBoard
from fleetgate.http.server import Request
from fleetgate.http.writer import ResponseWriter
from fleetgate.openai_api import error_body

_JSON = b"application/json"


class _Beat(msgspec.Struct):
    backend: Annotated[str, msgspec.Meta(max_length=512)]
    gpu: GpuReadings | None = None  # a GPU agent's readings, one per GPU


class HeartbeatEndpoint:
    def __init__(self, checker: ActiveChecker | None, gpus: GpuBoard | None = None) -> None:
        self._checker = checker  # counts beats for pools of check kind heartbeat
        self._gpus = gpus  # takes readings for pools with gpu.enabled

    async def beat(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        headers = [(b"content-type", _JSON), (b"x-request-id", request_id)]
        try:
            beat = msgspec.json.decode(request.body, type=_Beat)
        except msgspec.DecodeError as exc:
            param = "gpu" if "$.gpu" in str(exc) else "backend"
            message = f'Send {{"backend": "host:port", "gpu": [...]?}}: {exc}'
            writer.send(400, headers, error_body(400, message, param))
            return
        if beat.gpu is not None and len({r.index for r in beat.gpu}) < len(beat.gpu):
            message = "Each GPU's reading once: two readings have the same `index`."
            writer.send(400, headers, error_body(400, message, "gpu"))
            return
        if beat.gpu is not None:
            if self._gpus is None or not self._gpus.record(beat.backend, beat.gpu):
                message = (f"No pool takes GPU readings from {beat.backend!r}: set "
                           "`gpu.enabled: true` in the config of its pool.")  # fmt: skip
                writer.send(404, headers, error_body(404, message, "backend"))
                return
            if self._checker is not None:
                self._checker.beat(beat.backend)  # a heartbeat too, where one is expected
        elif self._checker is None or not self._checker.beat(beat.backend):
            message = f"No pool expects heartbeats from {beat.backend!r}."
            writer.send(404, headers, error_body(404, message, "backend"))
            return
        writer.send(200, headers, b'{"ok":true}')
