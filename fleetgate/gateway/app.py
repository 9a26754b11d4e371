"""The gateway's HTTP surface: which path does what, and the errors for everything else."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol
from urllib.parse import unquote

import msgspec

from fleetgate.batches.book import BatchBook
from fleetgate.gateway.admin import Admin
from fleetgate.gateway.batch_api import BatchApi
from fleetgate.gateway.dashboard import Dashboard
from fleetgate.gateway.entrance import LANE_HEADER, Entrance
from fleetgate.gateway.heartbeat import HeartbeatEndpoint
from fleetgate.gateway.requests import (
    BadRequest,
    is_form,
    parse_chat,
    parse_completion,
    parse_embedding,
    parse_passthrough,
    parse_responses,
    request_timeouts,
    with_model,
)
from fleetgate.http.forwarding import RequestHeaders
from fleetgate.http.server import Request
from fleetgate.http.writer import ResponseWriter
from fleetgate.lifecycle.downstream import Downstream
from fleetgate.lifecycle.events import (
    NO_BACKEND,
    Admitted,
    Finished,
    Outcome,
    Received,
    Rejected,
)
from fleetgate.lifecycle.hooks import Emitters
from fleetgate.observe.audit import AuditLog, key_id
from fleetgate.openai_api import JSON, error_body, with_fields
from fleetgate.resilience.cluster import Cluster
from fleetgate.resilience.failover import Failover
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.models import ModelRoute
from fleetgate.routing.stored_responses import StoredResponses
from fleetgate.traffic.door import ANONYMOUS_CALLER, Caller, FrontDoor, Refused
from fleetgate.traffic.keys import KeyRing, basic_password, bearer
from fleetgate.traffic.limits import PricingSettings
from fleetgate.upstream.attempt import Exchange

# Fields that steer an engine from outside (where to pull a KV cache from, which prefill
# server to meet): a client could point engines at any host with them, so they are dropped
# from the bodies of tenants not allowed them (`tenants[].engine_fields`).
ENGINE_FIELDS = (
    "kv_transfer_params", "disaggregated_params", "bootstrap_host", "bootstrap_port",
    "bootstrap_room", "priority",
)  # fmt: skip
BATCH_ENGINE_PRIORITY = 3  # a batch-lane request's `priority` for the engine: after every class
_ENGINE_FIELD = re.compile(b'"(' + b"|".join(f.encode() for f in ENGINE_FIELDS) + b')"')
# The engines order their queues by `priority` (engine_priority) in these bodies: JSON the
# gateway parsed (never a pass-through upload, which it leaves as it came).
_PRIORITISED = frozenset(("chat", "completions"))
_Parser = Callable[[bytes, dict[bytes, bytes]], RoutingRequest]
_Handler = Callable[[Request, ResponseWriter, bytes], Awaitable[None]]


class _Inference(Protocol):
    """A model endpoint's handler; `as_caller`, when given, is whose request it is (the batch
    runner's, through `Gateway.serve_as`: then no key is read from the headers)."""

    async def __call__(
        self,
        request: Request,
        writer: Downstream,
        request_id: bytes,
        as_caller: Caller | None = None,
    ) -> None: ...


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
    """OpenAI-compatible endpoints over the pools, plus health, readiness and metrics."""

    def __init__(
        self,
        clusters: Mapping[str, Cluster],
        failover: Failover,
        emit: Emitters,
        metrics: Callable[[], bytes] | None,
        clock: Callable[[], float],
        ids: RequestIds,
        created: int,
        admin: Admin | None = None,
        heartbeats: HeartbeatEndpoint | None = None,
        routes: Mapping[str, ModelRoute] | None = None,
        forward: RequestHeaders | None = None,
        door: FrontDoor | None = None,
        operators: KeyRing[str] | None = None,
        assumed_output_tokens: int = 256,
        pricing: Mapping[str, PricingSettings] | None = None,
        audit: AuditLog | None = None,
        dashboard: Dashboard | None = None,
        passthrough: Sequence[str] = (),
        batches: BatchApi | None = None,
    ) -> None:
        self._audit = audit  # operator endpoints' failed keys are written there
        self._clusters = dict(clusters)
        self._forward = forward or RequestHeaders()  # which of a client's headers go upstream
        self._door = door  # None: auth off and no limits, nothing to ask per request
        self._entrance = Entrance(door, pricing, assumed_output_tokens)
        # Keys of the operator's endpoints, owned by "admin" or "heartbeat" (None: auth off).
        self._operators = operators
        self._model_routes = dict(routes or {})  # names that lead to a pool: routing/models.py
        self._stored = StoredResponses()  # which backend keeps each Response
        self._failover = failover
        self._emit = emit  # for what happens before a request reaches its pool
        self._metrics = metrics  # the Prometheus text of the moment (None: not served)
        self._clock = clock
        self._ids = ids
        names = sorted([*self._clusters, *self._model_routes])
        self._known = ", ".join(names)
        self._model_cards = {
            m: {"id": m, "object": "model", "created": created, "owned_by": "fleetgate"}
            for m in names
        }
        self._models_body = msgspec.json.encode(
            {"object": "list", "data": list(self._model_cards.values())}
        )
        # The model endpoints, which a batch's requests may go to as well (`serve_as`).
        self._batchable: dict[bytes, _Inference] = {
            b"/v1/chat/completions": self._inference(parse_chat),
            b"/v1/completions": self._inference(parse_completion),
            b"/v1/embeddings": self._inference(parse_embedding),
            b"/v1/responses": self._inference(parse_responses),
        }
        post: dict[bytes, _Handler] = {**self._batchable}
        for other in passthrough:  # other model paths, routed by their `model`
            post[other.encode()] = self._inference(parse_passthrough)
        get: dict[bytes, _Handler] = {
            b"/v1/models": self._models,
            b"/healthz": self._healthz,
            b"/readyz": self._readyz,
        }
        if metrics is not None:
            get[b"/metrics"] = self._scrape
        tables = {b"POST": post, b"GET": get}
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
        """The Batch API's batches, for the runner the server starts (serve.py); None when the
        API is off."""
        return None if self._batches is None else self._batches.book

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

    async def serve_as(self, caller: Caller, path: bytes, body: bytes, writer: Downstream) -> None:
        """`body` as a POST to the model endpoint `path`, made by `caller` in this process
        and on the batch lane: the batch runner's way in (batches/runner.py). It goes the way
        a client's request goes (the caller's limits, admission, routing, retries, events);
        its answer is written to `writer` (a lifecycle/downstream.py Sink)."""
        headers = {b"content-type": JSON, LANE_HEADER: b"batch"}
        request = Request(b"POST", path, b"", headers, body, True, False)
        await self._batchable[path](request, writer, self._ids.next(), caller)

    def _inference(self, parse: _Parser) -> _Inference:
        async def handle(
            request: Request,
            writer: Downstream,
            request_id: bytes,
            as_caller: Caller | None = None,
        ) -> None:
            started = self._clock()
            emit, door = self._emit, self._door
            if emit.received is not None:
                traceparent = request.headers.get(b"traceparent")
                emit.received(Received(request_id, started, request.path, traceparent))
            caller = ANONYMOUS_CALLER if as_caller is None else as_caller
            model = ""  # the pool's, once known (never the client's string: metrics label it)
            try:
                if door is not None and as_caller is None:
                    caller = door.identify(request.headers)
                cluster, exchange = self._prepare(parse, request, writer, request_id, started,
                                                  caller)  # fmt: skip
                model = exchange.model
                entrance, headers = self._entrance, request.headers
                entry = entrance.enter_now(caller, exchange, headers, cluster.admission)
                if entry is None:
                    entry = await entrance.enter(caller, exchange, headers, cluster.admission)
                elif entry.waiting:
                    await entrance.wait(entry)
            except Refused as exc:  # a BadRequest too
                self._refuse(writer, request_id, started, exc, caller, model)
                return
            except Exception:
                self._finished_here(request_id, started, 500, "failed", model)  # server sends it
                raise
            except asyncio.CancelledError:  # the client left while the request waited its turn
                self._finished_here(request_id, started, 499, "client_closed", model)
                raise
            try:  # from here on the entry's holds are given back, whatever happens
                if cluster.engine_priority and exchange.routing.endpoint in _PRIORITISED:
                    level = BATCH_ENGINE_PRIORITY if exchange.batch else exchange.priority
                    exchange.body = with_fields(exchange.body, priority=level)
                now = self._clock()
                exchange.tenant, exchange.priority_label = caller.tenant.name, entry.priority.label
                exchange.queued_s = now - started
                if emit.admitted is not None:
                    emit.admitted(Admitted(request_id, now, exchange.model, exchange.routing,
                                           exchange.tenant, exchange.priority_label,
                                           exchange.queued_s))  # fmt: skip
                await self._failover.forward(cluster, exchange)
                if exchange.routing.endpoint == "responses":
                    self._keep(exchange)
            finally:
                settled = self._entrance.leave(entry, exchange)
                if settled is not None:
                    await settled

        return handle

    def _keep(self, exchange: Exchange) -> None:
        """Note where a Response is kept: its follow-ups must go there."""
        progress = exchange.progress
        made = exchange.response_id or (progress.id if progress is not None else "")
        if made and exchange.backend != NO_BACKEND and exchange.writer.status == 200:
            self._stored.record(made, exchange.backend, exchange.tenant)

    def _refuse(
        self,
        writer: Downstream,
        request_id: bytes,
        started: float,
        exc: Refused,
        caller: Caller,
        model: str = "",
    ) -> None:
        self._error(writer, request_id, exc.status, exc.message, exc.param, exc.code, exc.headers)
        rejected = self._emit.rejected
        if rejected is not None:
            reason = exc.code or "invalid_request"
            now = self._clock()
            priority = exc.priority.label if exc.priority is not None else ""
            # With auth on, the anonymous caller is one whose key was not read: "" (unknown).
            tenant = "" if caller is ANONYMOUS_CALLER and self.auth else caller.tenant.name
            rejected(Rejected(request_id, now, exc.status, reason, tenant, priority))
        self._finished_here(request_id, started, exc.status, "rejected", model)

    def _prepare(
        self,
        parse: _Parser,
        request: Request,
        writer: Downstream,
        request_id: bytes,
        started: float,
        caller: Caller,
    ) -> tuple[Cluster, Exchange]:
        """The pool a request goes to and its Exchange; `BadRequest` when it cannot go,
        `Refused` when its caller may not use the model."""
        if request.body_too_large:
            raise BadRequest(
                "The request body is larger than this gateway accepts; send a smaller one.",
                status=413, code="request_too_large",
            )  # fmt: skip
        routing = parse(request.body, request.headers)
        if routing.follows is not None:  # a Response's follow-up: to where its first is kept
            kept = self._stored.where(routing.follows)
            if kept is not None:
                if kept[1] != caller.tenant.name:  # another tenant's conversation
                    raise BadRequest(
                        f"No response {routing.follows[:80]!r} here.", "previous_response_id",
                        404, "not_found",
                    )  # fmt: skip
                routing.pinned = kept[0]
        if self._door is not None:
            self._door.allow(caller, routing.model)
        body = request.body
        content_type = JSON
        form = routing.endpoint == "other" and is_form(request.headers)
        if form:  # a pass-through upload: it goes as it came
            content_type = request.headers[b"content-type"]
        cluster = self._clusters.get(routing.model)
        route = self._model_routes.get(routing.model) if cluster is None else None
        if route is not None:
            if form:
                raise BadRequest(
                    f"{routing.model!r} is an alias; a form upload must name the model itself "
                    f"(one of: {', '.join(sorted(self._clusters))}).", "model",
                )  # fmt: skip
            routing.model = route.target(routing, request.headers)
            cluster = self._clusters[routing.model]
            body = with_model(body, routing.model)
        if cluster is None:
            raise BadRequest(
                f"The model {routing.model!r} does not exist here; known models: "
                f"{self._known}.", "model", 404, "model_not_found",
            )  # fmt: skip
        # Substring searches (memchr) before the regex: most bodies have none of them.
        if (
            not form
            and (b'_params"' in body or b'"bootstrap_' in body or b'"priority"' in body)
            and not caller.tenant.settings.engine_fields
            and _ENGINE_FIELD.search(body)
        ):
            body = with_fields(body, drop=ENGINE_FIELDS)
        timeouts = request_timeouts(cluster.timeouts, request.headers)
        model = cluster.model
        headers = [
            (b"content-type", content_type), (b"x-request-id", request_id),
            *self._forward.forwarded(request.headers),
        ]  # fmt: skip
        exchange = Exchange(
            model, routing, request.path, headers, body, request_id, writer, started,
            timeouts, cluster.emit, cluster.timeouts,
        )  # fmt: skip
        return cluster, exchange

    def _finished_here(
        self, request_id: bytes, started: float, status: int, outcome: Outcome, model: str = ""
    ) -> None:
        """The Finished of a request the gateway answered before routing it: `model` is its
        pool's when it was known (refused by a limit or shed), else "" (never the string the
        client sent: it may be anything)."""
        finished = self._emit.finished
        if finished is not None:
            finished(
                Finished(
                    request_id, self._clock(), model, started, status, NO_BACKEND, outcome, None,
                    None,
                )
            )  # fmt: skip

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
