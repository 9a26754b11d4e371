"""Operator endpoints (only with `server.admin: true`; behind the admin key when auth is on):

    GET    /admin/backends                 every backend: model, health flags, in flight,
                                           weights (configured and effective), last pick's
                                           scores by plugin, its GPU agent's last readings
    POST   /admin/backends {"model": M, "url": URL, "weight": W?, "labels": {...}?,
                            "max_in_flight": N?, "api_key": KEY?}
                                           a backend joins the pool of M (201, the backend)
    DELETE /admin/backends?backend=ID      it leaves: GONE at once, it takes no new request
                                           and leaves its pool when those in flight end (200
                                           when none was, 202 while some still are)
    POST   /admin/weight {"backend": ID, "weight": W}        its configured weight (> 0)
    POST   /admin/drain {"backend": ID, "draining": true|false}
    GET    /admin/slo                      each pool's objectives: figure, burn rates, alerts
    GET    /admin/config                   the config in effect, every secret redacted
    POST   /admin/config  (a whole config, YAML or JSON)
                                           served from the next request on, as a reloaded
                                           file is (fleetgate/reload.py); refused (400, the
                                           config in use kept) as a broken file is, and when
                                           it names other files than the config in use
    GET    /admin/tenants                  each tenant's requests admitted, tokens and spend
    GET    /admin/autoscale                each autoscaled pool's last decision: replicas now,
                                           desired, why, its signals, those draining
    GET    /admin/regions                  each region (backends' `region` label): backends,
                                           healthy, draining, and whether it is drained
    POST   /admin/regions/{name}/drain     a drill: every backend of the region drains (and
    POST   /admin/regions/{name}/undrain   those that join it) and traffic moves out of it
                                           gracefully; undrain brings them back

A backend is named by its id (host:port, as GET /admin/backends lists it), in every pool it
serves. A draining backend takes no new requests; those in flight finish. Every change (add,
remove, weight, drain, config, region drain) is written to the audit log (`server.audit_log`)
with the id of the key that made it; reads are not. Changes last until the gateway stops (a
reload keeps a backend added here): the config file is not rewritten.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qs

import msgspec

from fleetgate.autoscale.scaler import AutoscaleStatus
from fleetgate.config import BackendConfig, Config, ConfigError
from fleetgate.fleet.backend import REGION, BackendState, check_joining_url
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.membership import AlreadyMember, Joining, Membership, NotMember
from fleetgate.fleet.pool import Pool
from fleetgate.gateway.redact import redacted, without_credentials
from fleetgate.http.server import Request
from fleetgate.http.writer import ResponseWriter
from fleetgate.observe.audit import AuditLog, key_id
from fleetgate.observe.picks import LastPicks
from fleetgate.observe.slo import SloBook
from fleetgate.observe.usage import TenantUsage
from fleetgate.openai_api import error_body
from fleetgate.settings import Settings, positive
from fleetgate.traffic.door import Refused
from fleetgate.traffic.keys import bearer

_JSON = b"application/json"
T = TypeVar("T")
_AT, _NAMED = re.compile(r"- at `\$\.(\w+)"), re.compile(r"`(\w+)`")
Handler = Callable[[Request, ResponseWriter, bytes], Awaitable[None]]


REGIONS = b"/admin/regions/"  # then {name}/drain or {name}/undrain
DRILLED = HealthFlag.REGION_DRAINED
_REGION_PATH = re.compile(rb"/admin/regions/([A-Za-z0-9._-]{1,64})/(drain|undrain)").fullmatch


class _Region(msgspec.Struct):
    """A region, as GET /admin/regions lists it."""

    region: str
    drained: bool  # by the operator (a drill)
    backends: int = 0
    healthy: int = 0
    draining: int = 0


class _Drain(msgspec.Struct, forbid_unknown_fields=True):
    backend: str
    draining: bool = True


class _Weight(Settings, frozen=True):
    backend: str
    weight: float

    def __post_init__(self) -> None:
        positive("weight", self.weight)


class _Joining(BackendConfig, frozen=True, kw_only=True):
    """A backend to add: a config's backend entry (its checks) and the pool's model."""

    model: str


class Admin:
    def __init__(
        self,
        pools: Mapping[str, Pool],
        clock: Callable[[], float],
        members: Membership,
        picks: LastPicks,
        usage: TenantUsage,
        config: Config,
        audit: AuditLog | None = None,
        slo: SloBook | None = None,
        reload: Callable[[bytes], Awaitable[None]] | None = None,
        autoscale: Callable[[], list[AutoscaleStatus]] = list,
    ) -> None:
        self._autoscale = autoscale  # each autoscaled pool's last decision
        self._pools = pools
        self._clock = clock
        self._members = members
        self._picks = picks  # each backend's last pick, for its scores
        self._usage = usage
        self._config = msgspec.json.encode(redacted(config))  # frozen: encoded once
        self._audit = audit  # every change is written there, with the key that made it
        self._slo = slo
        self._reload = reload  # a config sent whole, applied (ConfigError: refused)

    def routes(self) -> dict[tuple[bytes, bytes], Handler]:
        """(method, path) and the handler of each endpoint."""
        return {
            (b"GET", b"/admin/backends"): self.backends,
            (b"POST", b"/admin/backends"): self.add,
            (b"DELETE", b"/admin/backends"): self.remove,
            (b"POST", b"/admin/weight"): self.weight,
            (b"POST", b"/admin/drain"): self.drain,
            (b"GET", b"/admin/slo"): self.slo,
            (b"GET", b"/admin/config"): self.config,
            (b"POST", b"/admin/config"): self.reload,
            (b"GET", b"/admin/tenants"): self.tenants,
            (b"GET", b"/admin/regions"): self.regions,
            (b"GET", b"/admin/autoscale"): self.autoscale,
        }

    # -- reads ----------------------------------------------------------------------------------

    def _view(self, model: str, pool: Pool, s: BackendState, now: float) -> dict[str, Any]:
        pick = self._picks.of(model, s.backend.id)
        last = None if pick is None else {"age_s": now - pick.at, "kind": pick.kind,
                                          "scores": pick.scores}  # fmt: skip
        return {
            "model": model,
            "backend": s.backend.id,
            "name": s.backend.name,
            "url": without_credentials(s.backend.url),
            "labels": dict(s.backend.labels),
            "verdict": s.verdict(now).value,
            "flags": [f.name for f in HealthFlag if f in s.flags],
            "leaving": pool.retiring(s),  # removed, its last requests still in flight
            "in_flight": pool.board.load(s.backend.id).in_flight,
            "engine": s.engine,
            "kind": s.kind.kind,  # what serves it (fleet/engines.py); "pending" until probed
            "ewma_ttft_s": s.latency.ttft_s,
            "ewma_tpot_s": s.latency.tpot_s,
            "ewma_e2e_s": s.latency.e2e_s,
            "weight": s.weight,  # effective: configured x speed x slow-start x throttle share
            "configured_weight": s.backend.weight,
            "speed": s.speed,
            "last_pick": last,  # when it was last picked, and each scorer's score then
            "throttle_share": s.throttle_share,  # of its weight kept while its GPUs throttle
            "gpu": _gpus(s, now),  # its GPU agent's last readings (null: no agent)
        }

    def _listing(self) -> bytes:
        now = self._clock()
        return msgspec.json.encode(
            [
                self._view(model, pool, s, now)
                for model, pool in self._pools.items()
                for s in pool.states
            ]
        )

    async def backends(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        writer.send(200, _headers(request_id), self._listing())

    async def slo(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        status = self._slo.status() if self._slo is not None else {}
        writer.send(200, _headers(request_id), msgspec.json.encode(status))

    async def config(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        writer.send(200, _headers(request_id), self._config)

    async def reload(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        headers = _headers(request_id)
        try:
            if self._reload is None:
                raise ConfigError("this gateway cannot reload its config")
            await self._reload(request.body)
        except ConfigError as exc:
            self._record("admin_config_refused", request, request_id, error=str(exc))
            message = f"The config was refused, and the one in use kept: {exc}"
            writer.send(400, headers, error_body(400, message, None, "invalid_config"))
            return
        self._record("admin_config_reloaded", request, request_id)
        writer.send(200, headers, b'{"status":"reloaded"}')

    async def autoscale(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        body = msgspec.json.encode({"pools": self._autoscale()})
        writer.send(200, _headers(request_id), body)

    async def regions(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        writer.send(200, _headers(request_id), self._regions())

    def _regions(self) -> bytes:
        drained = self._members.drained_regions
        rows = {name: _Region(name, True) for name in drained}  # with no backend yet too
        for pool in self._pools.values():
            for state in pool.states:
                name = state.backend.labels.get(REGION)
                if name is None:
                    continue
                row = rows.get(name) or rows.setdefault(name, _Region(name, False))
                row.backends += 1
                row.healthy += not state.flags
                row.draining += bool(state.flags & (HealthFlag.DRAINING | DRILLED))
        return msgspec.json.encode([rows[name] for name in sorted(rows)])

    async def region(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        """POST /admin/regions/{name}/drain or /undrain (the gateway routes the prefix here)."""
        headers = _headers(request_id)
        match = _REGION_PATH(request.path)
        if match is None:
            message = "Use POST /admin/regions/{name}/drain or /undrain (name: [A-Za-z0-9._-])."
            writer.send(404, headers, error_body(404, message, None, "unknown_url"))
            return
        if request.method != b"POST":
            writer.send(405, [*headers, (b"allow", b"POST")],
                        error_body(405, "Use POST.", None, "method_not_allowed"))  # fmt: skip
            return
        name, draining = match[1].decode(), match[2] == b"drain"
        found = self._members.drain_region(name, draining)
        self._record("admin_region_drain", request, request_id, region=name,
                     draining=draining, backends=len(found))  # fmt: skip
        writer.send(200, headers, self._regions())

    async def tenants(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        writer.send(200, _headers(request_id), msgspec.json.encode(self._usage.tenants()))

    # -- changes --------------------------------------------------------------------------------

    async def add(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        try:
            order = _decode(request.body, _Joining, "{'model': M, 'url': URL, 'weight': W?, "
                            "'labels': {...}?}")  # fmt: skip
            if order.url is None:  # the config's other kind, `sim`, starts with the gateway
                raise Refused(400, "Give the backend's `url`: sim workers start with the "
                              "gateway, from its config.", None, param="url")  # fmt: skip
            _check_url(order.url)
            joining = Joining(
                url=order.url,
                weight=order.weight,
                labels=order.labels,
                max_in_flight=order.max_in_flight,
                api_key=order.api_key,
                cost_per_hour_usd=order.cost_per_hour_usd,
                engine=order.engine,
            )
            try:
                state = self._members.add(order.model, joining)
            except NotMember as exc:
                raise Refused(404, f"{exc}.", None, param="model") from None
            except AlreadyMember as exc:
                then = "add it again once it has left" if exc.leaving else "DELETE it first"
                raise Refused(409, f"{exc}; {then}.", None, param="url") from None
        except Refused as exc:
            writer.send(exc.status, _headers(request_id), error_body(exc.status, exc.message,
                                                                     exc.param))  # fmt: skip
            return
        self._record(
            "admin_backend_added", request, request_id, backend=state.backend.id,
            model=order.model, url=order.url, weight=order.weight, labels=order.labels,
        )  # fmt: skip
        view = self._view(order.model, self._pools[order.model], state, self._clock())
        writer.send(201, _headers(request_id), msgspec.json.encode(view))

    async def remove(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        query = parse_qs(request.query.decode("latin-1"))
        backend = query.get("backend", [""])[0]
        headers = _headers(request_id)
        if not backend:
            message = "Name the backend: DELETE /admin/backends?backend=ID."
            writer.send(400, headers, error_body(400, message, "backend"))
            return
        try:
            removed = self._members.remove(backend)
        except NotMember:
            writer.send(404, headers, _no_backend(backend))
            return
        # Those still in flight to the members leaving (one that left had none).
        in_flight = sum(
            pool.board.load(s.backend.id).in_flight for pool, s in removed if pool.retiring(s)
        )
        self._record(
            "admin_backend_removed", request, request_id, backend=backend,
            models=[pool.model for pool, _ in removed], in_flight=in_flight,
        )  # fmt: skip
        body = {"backend": backend, "models": [p.model for p, _ in removed], "in_flight": in_flight}
        writer.send(202 if in_flight else 200, headers, msgspec.json.encode(body))

    async def weight(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        headers = _headers(request_id)
        try:
            order = _decode(request.body, _Weight, "{'backend': ID, 'weight': W}")
        except Refused as exc:
            writer.send(exc.status, headers, error_body(exc.status, exc.message, exc.param))
            return
        try:
            changed = self._members.set_weight(order.backend, order.weight)
        except NotMember:
            writer.send(404, headers, _no_backend(order.backend))
            return
        self._record(
            "admin_weight", request, request_id, backend=order.backend, weight=order.weight,
            models=[pool.model for pool, _ in changed],
        )  # fmt: skip
        writer.send(200, headers, self._listing())

    async def drain(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        headers = _headers(request_id)
        try:
            order = _decode(request.body, _Drain, "{'backend': ID, 'draining': true|false}")
        except Refused as exc:
            writer.send(exc.status, headers, error_body(exc.status, exc.message, exc.param))
            return
        try:
            self._members.drain(order.backend, order.draining)
        except NotMember:
            writer.send(404, headers, _no_backend(order.backend))
            return
        self._record("admin_drain", request, request_id, backend=order.backend,
                     draining=order.draining)  # fmt: skip
        writer.send(200, headers, self._listing())

    def _record(self, event: str, request: Request, request_id: bytes, **fields: Any) -> None:
        """A change, in the audit log (when there is one), with the key that made it."""
        if self._audit is not None:
            self._audit.record(
                event, key=key_id(bearer(request.headers)), **fields,
                request_id=request_id.decode("latin-1"),
            )  # fmt: skip


def _gpus(state: BackendState, now: float) -> dict[str, Any] | None:
    gpus = state.gpus
    if gpus is None:
        return None
    return {
        "state": gpus.state,  # ok, throttled, fault; stale: too old to count (the rest kept)
        "age_s": now - gpus.at,
        "faults": gpus.faults,
        "throttling": gpus.throttling,
        "xid_totals": gpus.xid_totals,
        "readings": gpus.readings,
    }


def _headers(request_id: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", _JSON), (b"x-request-id", request_id)]


def _decode(body: bytes, kind: type[T], shape: str) -> T:
    """The request's JSON as `kind`; a 400 that shows the shape to send when it is not."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.DecodeError as exc:  # a ValidationError too: a field's check failed
        # The field at fault: msgspec's "... - at `$.weight`", else the first one named
        # ("unknown field `colour`", "missing required field `model`", "`weight` must ...").
        found = _AT.search(str(exc)) or _NAMED.search(str(exc))
        param = found.group(1) if found else None
        raise Refused(400, f"Send {shape}: {exc}", None, param=param) from None


def _check_url(url: str) -> None:
    try:
        check_joining_url(url)
    except ValueError as exc:
        raise Refused(400, str(exc), None, param="url") from None


def _no_backend(backend: str) -> bytes:
    message = f"No backend {backend!r}; GET /admin/backends lists them."
    return error_body(404, message, "backend")
