"""The gateway's HTTP surface: which path does what, and the errors for everything else."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from urllib.parse import unquote

import msgspec

from fleetgate.batches.book import BatchBook
from fleetgate.gateway.admin import REGIONS, Admin
from fleetgate.gateway.batch_api import BatchApi
from fleetgate.gateway.dashboard import Dashboard
from fleetgate.gateway.heartbeat import HeartbeatEndpoint
from fleetgate.gateway.inference import InferenceEndpoints
from fleetgate.http.server import Request
from fleetgate.http.writer import ResponseWriter
from fleetgate.lifecycle.downstream import Downstream
from fleetgate.observe.audit import AuditLog, key_id
from fleetgate.openai_api import JSON, error_body
from fleetgate.resilience.cluster import Cluster
from fleetgate.traffic.door import FrontDoor, Refused
from fleetgate.traffic.keys import KeyRing, basic_password, bearer

_Handler = Callable[[Request, ResponseWriter, bytes], Awaitable[None]]


# A client's own request id is echoed in answers and logs: only if it cannot forge either.
_CLIENT_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}").fullmatch


class RequestIds:
    """Request ids: a random per-process prefix and a counter (unique, and cheap to make)."""

    def __init__(self, prefix: str | None = None) -> None:
        self._prefix = (prefix or os.urandom(6).hex()).encode()
        self._counter = itertools.count(1)

    def next(self) -> bytes:
        return b"%b-%x" % (self._prefix, next(self._counter))

    def of(self, client: bytes | None) -> bytes:
        """The client's x-request-id when it is only [A-Za-z0-9._:-], at most 128 long; else
        a new one."""
        if client is not None and _CLIENT_ID(client) is not None:
            return client
        return self.next()


class Gateway:
    """The HTTP edge: which path does what (the model endpoints: gateway/inference.py; the
    operator's, behind their key), models, health, readiness and metrics, and the errors for
    everything else."""

    def __init__(
        self,
        *,
        inference: InferenceEndpoints,
        clusters: Mapping[str, Cluster],
        models: Sequence[str],
        ids: RequestIds,
        created: int,
        metrics: Callable[[], bytes] | None = None,
        door: FrontDoor | None = None,
        operators: KeyRing[str] | None = None,
        audit: AuditLog | None = None,
        admin: Admin | None = None,
        heartbeats: HeartbeatEndpoint | None = None,
        dashboard: Dashboard | None = None,
        batches: BatchApi | None = None,
    ) -> None:
        self.inference = inference
        self._audit = audit  # operator endpoints' failed keys are written there
        self._clusters = dict(clusters)
        self._door = door  # None: auth off and no limits (the models listed are everyone's)
        # Keys of the operator's endpoints, owned by "admin" or "heartbeat" (None: auth off).
        self._operators = operators
        self._metrics = metrics  # the Prometheus text of the moment (None: not served)
        self._ids = ids
        names = sorted(models)
        self._model_cards = {
            m: {"id": m, "object": "model", "created": created, "owned_by": "fleetgate"}
            for m in names
        }
        self._models_body = msgspec.json.encode(
            {"object": "list", "data": list(self._model_cards.values())}
        )
        post: dict[bytes, _Handler] = {**inference.routes()}
        get: dict[bytes, _Handler] = {
            b"/v1/models": self._models,
            b"/healthz": self._healthz,
            b"/readyz": self._readyz,
        }
        if metrics is not None:
            get[b"/metrics"] = self._scrape
        tables = {b"POST": post, b"GET": get}
        # POST /admin/regions/{name}/drain|undrain: a path of its own per region.
        self._region = None if admin is None else self._operator("admin", admin.region)
        if admin is not None:
            for (method, path), handler in admin.routes().items():
                tables.setdefault(method, {})[path] = self._operator("admin", handler)
        self._batches = batches
        if batches is not None:
            for (method, path), handler in batches.routes().items():
                tables.setdefault(method, {})[path] = handler
        if heartbeats is not None:
            post[b"/fleet/heartbeat"] = self._operator("heartbeat", heartbeats.beat)
        self._dashboard = dashboard
        if dashboard is not None:  # a browser's page: the admin key as Basic auth's password
            for path, page in dashboard.routes().items():
                get[path] = self._operator("admin", page, browser=True)
        self._routes: dict[bytes, dict[bytes, _Handler]] = {}
        for method, table in tables.items():
            for path, handler in table.items():
                self._routes.setdefault(path, {})[method] = handler

    @property
    def batch_book(self) -> BatchBook | None:
        """The Batch API's batches, for the runner the server starts (running.py); None when the
        API is off."""
        return None if self._batches is None else self._batches.book

    @property
    def clusters(self) -> Mapping[str, Cluster]:
        """Each pool's cluster, by model."""
        return self._clusters

    @property
    def has_dashboard(self) -> bool:
        return self._dashboard is not None

    def end_streams(self) -> None:
        """End the dashboard's event streams: they would hold a drain until its timeout."""
        if self._dashboard is not None:
            self._dashboard.close()

    @property
    def auth(self) -> bool:
        """Whether clients need an API key."""
        return self._door is not None and self._door.auth

    async def handle(self, request: Request, writer: ResponseWriter) -> None:
        request_id = self._ids.of(request.headers.get(b"x-request-id"))
        methods = self._routes.get(request.path)
        if methods is None:
            if request.path.startswith(b"/v1/models/") and request.method == b"GET":
                self._model(request, writer, request_id)
                return
            if self._batches is not None and self._batches.serves(request.path):
                await self._batches.item(request, writer, request_id)
                return
            if self._region is not None and request.path.startswith(REGIONS):
                await self._region(request, writer, request_id)
                return
            paths = ", ".join(sorted(p.decode() for p in self._routes))
            self._error(
                writer, request_id, 404, f"Unknown path {request.path.decode('latin-1')!r}; "
                f"fleetgate serves: {paths}.", code="unknown_url"
            )  # fmt: skip
            return
        handler = methods.get(request.method)
        if handler is None:
            allowed = ", ".join(m.decode() for m in methods)
            self._error(
                writer, request_id, 405,
                f"{request.method.decode()} is not allowed on {request.path.decode()}; "
                f"use {allowed}.", code="method_not_allowed", extra=[(b"allow", allowed.encode())],
            )  # fmt: skip
            return
        await handler(request, writer, request_id)

    def send_error(
        self,
        writer: Downstream,
        status: int,
        message: str,
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """The server's answer to what never became a request (bad HTTP, a head too large, a
        request too slow to arrive, the server full, a handler crash): OpenAI-shaped, with a
        request id."""
        self._error(writer, self._ids.next(), status, message, extra=[*headers])

    def _error(
        self,
        writer: Downstream,
        request_id: bytes,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        headers = [(b"content-type", JSON), (b"x-request-id", request_id), *(extra or ())]
        writer.send(status, headers, error_body(status, message, param, code))

    def _operator(self, role: str, handler: _Handler, browser: bool = False) -> _Handler:
        """`handler` behind the operator's credential for `role` (when auth is on); a
        `browser` page also takes it as HTTP Basic auth's password (any user name), and its
        401 asks the browser for it."""
        challenge = [(b"www-authenticate", b'Basic realm="fleetgate", charset="UTF-8"')]

        async def guarded(request: Request, writer: ResponseWriter, request_id: bytes) -> None:
            if self._operators is not None:
                key = bearer(request.headers)
                if key is None and browser:
                    key = basic_password(request.headers)
                if self._operators.owner(key) != role:
                    message = f"This endpoint needs the {role} key: `Authorization: Bearer KEY`."
                    self._error(writer, request_id, 401, message, code="invalid_api_key",
                                extra=challenge if browser else None)  # fmt: skip
                    if self._audit is not None:
                        self._audit.auth_failed(
                            reason="invalid_api_key", role=role, key=key_id(key),
                            path=request.path.decode("latin-1"),
                            request_id=request_id.decode("latin-1"),
                        )  # fmt: skip
                    return
            await handler(request, writer, request_id)

        return guarded

    async def _models(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        body = self._models_body
        if self._door is not None and self._door.auth:
            try:
                tenant = self._door.identify(request.headers).tenant
            except Refused as exc:
                self._error(writer, request_id, exc.status, exc.message, code=exc.code)
                return
            listing = msgspec.json.decode(body)
            listing["data"] = [m for m in listing["data"] if tenant.may_use(m["id"])]
            body = msgspec.json.encode(listing)
        writer.send(200, [(b"content-type", JSON), (b"x-request-id", request_id)], body)

    def _model(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        """GET /v1/models/{id}: one model's card; 404 for one this caller may not use."""
        name = unquote(request.path[len(b"/v1/models/") :].decode("latin-1"))
        card = self._model_cards.get(name)
        if self._door is not None and self._door.auth:  # the caller first: a 401 says nothing
            try:
                if not self._door.identify(request.headers).tenant.may_use(name):
                    card = None
            except Refused as exc:
                self._error(writer, request_id, exc.status, exc.message, code=exc.code)
                return
        if card is None:
            self._error(
                writer, request_id, 404, f"The model {name[:200]!r} does not exist here.",
                "model", "model_not_found",
            )  # fmt: skip
            return
        writer.send(200, [(b"content-type", JSON), (b"x-request-id", request_id)],
                    msgspec.json.encode(card))  # fmt: skip

    async def _healthz(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        writer.send(
            200, [(b"content-type", JSON), (b"x-request-id", request_id)], b'{"status":"ok"}'
        )

    async def _readyz(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        unready = sorted(m for m, c in self._clusters.items() if not c.pool.ready)
        headers = [(b"content-type", JSON), (b"x-request-id", request_id)]
        if unready:
            body = msgspec.json.encode({"status": "not ready", "models_without_backend": unready})
            writer.send(503, headers, body)
        else:
            writer.send(200, headers, b'{"status":"ready"}')

    async def _scrape(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        assert self._metrics is not None  # routed only then
        writer.send(
            200,
            [
                (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
                (b"x-request-id", request_id),
            ],
            self._metrics(),
        )
