"""Operator endpoints (only with `server.admin: true`): see backends, drain and undrain them.

    GET  /admin/backends                  every backend: model, health flags, in flight
    GET  /admin/slo                       each pool's objectives: figure, burn rates, alerts
    POST /admin/drain {"backend": ID, "draining": true|false}
A draining backend takes no new requests; those in flight finish.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.pool import Pool
from fleetgate.http.server import Request
from fleetgate.http.writer import ResponseWriter
from fleetgate.observe.audit import AuditLog, key_id
from fleetgate.observe.slo import SloBook
from fleetgate.openai_api import error_body
from fleetgate.traffic.keys import bearer

_JSON = b"application/json"


class _Drain(msgspec.Struct, forbid_unknown_fields=True):
    backend: str
    draining: bool = True


class Admin:
    def __init__(
        self,
        pools: Mapping[str, Pool],
        clock: Callable[[], float],
        audit: AuditLog | None = None,
        slo: SloBook | None = None,
    ) -> None:
        self._pools = pools
        self._clock = clock
        self._audit = audit  # every change is written there, with the key that made it
        self._slo = slo

    def _listing(self) -> bytes:
        now = self._clock()
        return msgspec.json.encode(
            [
                {
                    "model": model,
                    "backend": s.backend.id,
                    "url": s.backend.url,
                    "verdict": s.verdict(now).value,
                    "flags": [f.name for f in HealthFlag if f in s.flags],
                    "in_flight": s.in_flight,
                    "engine": s.engine,
                    "ewma_ttft_s": s.latency.ttft_s,
                    "ewma_tpot_s": s.latency.tpot_s,
                    "ewma_e2e_s": s.latency.e2e_s,
                    "weight": s.weight,
                    "speed": s.speed,
                }
                for model, pool in self._pools.items()
                for s in pool.states
            ]
        )

    async def backends(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        writer.send(200, [(b"content-type", _JSON), (b"x-request-id", request_id)], self._listing())

    async def slo(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        status = self._slo.status() if self._slo is not None else {}
        writer.send(
            200, [(b"content-type", _JSON), (b"x-request-id", request_id)],
            msgspec.json.encode(status),
        )  # fmt: skip

    async def drain(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        headers = [(b"content-type", _JSON), (b"x-request-id", request_id)]
        try:
            order = msgspec.json.decode(request.body, type=_Drain)
        except msgspec.DecodeError as exc:
            message = f"Send {{'backend': ID, 'draining': true|false}}: {exc}"
            writer.send(400, headers, error_body(400, message))
            return
        now, found = self._clock(), False
        for pool in self._pools.values():
            for state in pool.states:
                if state.backend.id == order.backend:
                    found = True
                    if order.draining:
                        state.flags |= HealthFlag.DRAINING
                    else:
                        state.flags &= ~HealthFlag.DRAINING
                    pool.refresh(now)
        if not found:
            message = f"No backend {order.backend!r}; GET /admin/backends lists them."
            writer.send(404, headers, error_body(404, message, "backend"))
            return
        if self._audit is not None:
            self._audit.record(
                "admin_drain", key=key_id(bearer(request.headers)), backend=order.backend,
                draining=order.draining, request_id=request_id.decode("latin-1"),
            )  # fmt: skip
        writer.send(200, headers, self._listing())
