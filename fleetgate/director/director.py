"""The Director: one inference request's whole lifecycle, knowing no HTTP. Given a parsed
request (director/request.py) and the client it answers (a Downstream), it runs

    received -> its pool (a Response's follow-up pinned where its first is kept; a model
    alias resolved) -> its caller's right to the model -> limits and admission
    (director/entrance.py) -> admitted -> routing, attempts, retries, hedging, continuation
    (resilience/failover.py) -> where a Response is kept -> finished

and reports every step as a lifecycle event. What it refuses it answers itself, in OpenAI's
error shape, with a Rejected and a Finished event. The gateway's edge (gateway/) calls it for
each request to a model endpoint; the batch runner for each request of a batch.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping

from fleetgate.director.cache import Answer, ResponseCache, cache_key, directives
from fleetgate.director.entrance import Entrance, Entry
from fleetgate.director.replay import Keeping, as_stream, asks_usage
from fleetgate.director.request import InferenceRequest, request_timeouts
from fleetgate.lifecycle.downstream import Downstream
from fleetgate.lifecycle.events import (
    NO_BACKEND,
    Admitted,
    CacheResult,
    Finished,
    Outcome,
    Received,
    Rejected,
)
from fleetgate.lifecycle.hooks import Emitters
from fleetgate.openai_api import JSON, SSE_HEADERS, error_body, usage_of, with_fields
from fleetgate.resilience.cluster import Cluster
from fleetgate.resilience.failover import Failover, finished
from fleetgate.routing.models import ModelRoute
from fleetgate.routing.stored_responses import StoredResponses
from fleetgate.routing.stores import ResponsePins
from fleetgate.traffic.door import ANONYMOUS_CALLER, Caller, FrontDoor, Refused
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


class Director:
    """Runs each inference request over the pools, from its arrival to its Finished event."""

    def __init__(
        self,
        *,
        clusters: Mapping[str, Cluster],
        failover: Failover,
        emit: Emitters,
        clock: Callable[[], float],
        door: FrontDoor | None = None,
        routes: Mapping[str, ModelRoute] | None = None,
        pricing: Mapping[str, PricingSettings] | None = None,
        assumed_output_tokens: int = 256,
        pins: ResponsePins | None = None,
        cache: ResponseCache | None = None,
    ) -> None:
        self._clusters = dict(clusters)
        self._failover = failover
        self._emit = emit  # for what happens before a request reaches its pool
        self._clock = clock
        self._door = door  # None: auth off and no limits, nothing to ask per request
        self._routes = dict(routes or {})  # names that lead to a pool: routing/models.py
        self._entrance = Entrance(door, pricing, assumed_output_tokens)
        # Which backend keeps each Response (None: this process's own record of them).
        self._stored = StoredResponses() if pins is None else pins
        self._known = ", ".join(sorted([*self._clusters, *self._routes]))
        self._cache = cache  # None: every request goes to a backend

    def received(self, request_id: bytes, started: float, path: bytes,
                 traceparent: bytes | None = None) -> None:  # fmt: skip
        """A request arrived at a model endpoint (before its caller or body is known)."""
        if self._emit.received is not None:
            self._emit.received(Received(request_id, started, path, traceparent))

    def refuse(
        self,
        downstream: Downstream,
        *,
        request_id: bytes,
        started: float,
        refusal: Refused,
        caller: Caller,
        model: str = "",
    ) -> None:
        """Answer a request turned away before routing (by the edge: a bad body or key; or
        here), with its Rejected and Finished events. `model`: its pool's, once known."""
        headers = [(b"content-type", JSON), (b"x-request-id", request_id), *refusal.headers]
        body = error_body(refusal.status, refusal.message, refusal.param, refusal.code)
        downstream.send(refusal.status, headers, body)
        rejected = self._emit.rejected
        if rejected is not None:
            priority = refusal.priority.label if refusal.priority is not None else ""
            # With auth on, the anonymous caller is one whose key was not read: "" (unknown).
            tenant = "" if caller is ANONYMOUS_CALLER and self.auth else caller.tenant.name
            rejected(Rejected(request_id, self._clock(), refusal.status,
                              refusal.code or "invalid_request", tenant, priority))  # fmt: skip
        self._finished_here(request_id, started, refusal.status, "rejected", model)

    def failed_here(self, request_id: bytes, started: float) -> None:
        """The Finished of a request the edge failed on (its own bug: the server answers
        500), so that every received request still ends with one."""
        self._finished_here(request_id, started, 500, "failed")

    @property
    def auth(self) -> bool:
        """Whether callers need an API key."""
        return self._door is not None and self._door.auth

    async def run(self, request: InferenceRequest, downstream: Downstream) -> None:
        """Answer `request` to `downstream` from its pool: the whole lifecycle after it was
        received (`received`)."""
        caller, started, request_id = request.caller, request.started, request.request_id
        model = ""  # the pool's, once known (never the client's string: metrics label it)
        try:
            cluster, exchange = self._exchange(request, downstream)
            model = exchange.model
            entry = await self._entrance.enter(request, exchange, cluster.admission)
        except Refused as exc:
            self.refuse(downstream, request_id=request_id, started=started, refusal=exc,
                        caller=caller, model=model)  # fmt: skip
            return
        except Exception:
            self._finished_here(request_id, started, 500, "failed", model)  # the edge answers
            raise
        except asyncio.CancelledError:  # the client left while the request waited its turn
            self._finished_here(request_id, started, 499, "client_closed", model)
            raise
        key, lookup = None, False
        if self._cache is not None and not request.upload:
            keep, lookup = directives(request.cache_control)
            if keep:
                key = cache_key(caller.tenant.name, exchange.model, request.routing.endpoint,
                                request.body)  # fmt: skip
        try:  # from here on the entry's holds are given back, whatever happens
            await self._forward(cluster, exchange, entry, caller, key, lookup)
        finally:
            await self._entrance.leave(entry, exchange)

    async def _forward(
        self,
        cluster: Cluster,
        ex: Exchange,
        entry: Entry,
        caller: Caller,
        key: bytes | None,
        lookup: bool,
    ) -> None:
        """From admitted on; `key`: the request's in the response cache (None: not kept),
        `lookup`: it may be answered from there."""
        if cluster.engine_priority and ex.routing.endpoint in _PRIORITISED:
            level = BATCH_ENGINE_PRIORITY if ex.batch else ex.priority
            ex.body = with_fields(ex.body, priority=level)
        now = self._clock()
        ex.tenant, ex.priority_label = caller.tenant.name, entry.priority.label
        ex.queued_s = now - ex.started
        if self._emit.admitted is not None:
            self._emit.admitted(
                Admitted(
                    request_id=ex.request_id,
                    at=now,
                    model=ex.model,
                    request=ex.routing,
                    tenant=ex.tenant,
                    priority=ex.priority_label,
                    queued_s=ex.queued_s,
                )
            )
        if key is None:
            await self._failover.forward(cluster, ex)
        else:
            await self._cached(cluster, ex, key, lookup)
        if ex.routing.endpoint == "responses":
            self._keep(ex)

    async def _cached(self, cluster: Cluster, ex: Exchange, key: bytes, lookup: bool) -> None:
        """`ex` answered from the cache, or by an identical request in flight, when it may
        be; else by its pool, its whole answer kept (director/cache.py)."""
        cache = self._cache
        assert cache is not None
        # A stream's answer is not kept: identical requests would wait for nothing.
        answer, result, leads = await cache.find(key, lookup, not ex.routing.stream)
        if answer is not None:
            self._answer_kept(cluster, ex, answer, result)
            return
        keeping = Keeping(ex.writer)
        ex.writer, ex.cache = keeping, "miss"
        kept = None
        try:
            await self._failover.forward(cluster, ex)
            if keeping.headers is not None:
                kept = cache.keep(key, keeping.headers, keeping.body)
        finally:
            cache.landed(key, kept, leads)

    def _answer_kept(self, cluster: Cluster, ex: Exchange, answer: Answer,
                     result: CacheResult) -> None:  # fmt: skip
        """Send the client a kept answer (as a stream if it asked for one), and its
        Finished; its tenant is charged the answer's usage, as for one a backend gave."""
        ex.cache, ex.backend, ex.ttft_s = result, NO_BACKEND, self._clock() - ex.started
        if ex.count_usage:
            ex.usage = usage_of(answer.body)
        said = [(b"x-request-id", ex.request_id), (b"x-fleetgate-cache", result.encode())]
        if ex.routing.stream:
            events = as_stream(ex.routing.endpoint, answer.body, asks_usage(ex.body))
            ex.writer.start(200, [*SSE_HEADERS, *said], ex.reply_head)
            for event in events[:-1]:
                ex.writer.write(event)
            ex.writer.end(events[-1])
        else:
            ex.writer.send(200, [*answer.headers, *said], answer.body, ex.reply_head)
        if cluster.emit.finished is not None:
            cluster.emit.finished(finished(ex, self._clock(), 200, "answered"))

    def _exchange(self, request: InferenceRequest, downstream: Downstream
                  ) -> tuple[Cluster, Exchange]:  # fmt: skip
        """The request's pool and Exchange; `Refused` when it cannot go there."""
        routing, caller = request.routing, request.caller
        routing.regions = caller.tenant.regions  # residency: every attempt stays in them
        routing.stays = caller.tenant.stays  # never spilled out of the gateway's region
        if routing.follows is not None:  # a Response's follow-up: to where its first is kept
            kept = self._stored.where(routing.follows)
            if kept is not None:
                if kept[1] != caller.tenant.name:  # another tenant's conversation
                    raise Refused(404, f"No response {routing.follows[:80]!r} here.",
                                  "not_found", param="previous_response_id")  # fmt: skip
                routing.pinned = kept[0]
        if self._door is not None:
            self._door.allow(caller, routing.model)
        body = request.body
        cluster = self._clusters.get(routing.model)
        route = self._routes.get(routing.model) if cluster is None else None
        if route is not None:
            if request.upload:
                raise Refused(
                    400, f"{routing.model!r} is an alias; a form upload must name the model "
                    f"itself (one of: {', '.join(sorted(self._clusters))}).", None, param="model",
                )  # fmt: skip
            routing.model = route.target(routing, request.metadata)
            cluster = self._clusters[routing.model]
            body = with_fields(body, model=routing.model)
        if cluster is None:
            raise Refused(404, f"The model {routing.model!r} does not exist here; known models: "
                          f"{self._known}.", "model_not_found", param="model")  # fmt: skip
        # Substring searches (memchr) before the regex: most bodies have none of them.
        if (
            not request.upload
            and (b'_params"' in body or b'"bootstrap_' in body or b'"priority"' in body)
            and not caller.tenant.settings.engine_fields
            and _ENGINE_FIELD.search(body)
        ):
            body = with_fields(body, drop=ENGINE_FIELDS)
        headers = [
            (b"content-type", request.content_type), (b"x-request-id", request.request_id),
            *request.forwarded,
        ]  # fmt: skip
        exchange = Exchange(
            model=cluster.model, routing=routing, path=request.path, headers=headers, body=body,
            request_id=request.request_id, writer=downstream, started=request.started,
            timeouts=request_timeouts(cluster.timeouts, request.metadata), emit=cluster.emit,
            board=cluster.router.pool.board, pool_timeouts=cluster.timeouts,
        )  # fmt: skip
        return cluster, exchange

    def _keep(self, ex: Exchange) -> None:
        """Note where a Response is kept: its follow-ups must go there."""
        progress = ex.progress
        made = ex.response_id or (progress.id if progress is not None else "")
        if made and ex.backend != NO_BACKEND and ex.writer.status == 200:
            self._stored.record(made, ex.backend, ex.tenant)

    def _finished_here(
        self, request_id: bytes, started: float, status: int, outcome: Outcome, model: str = ""
    ) -> None:
        """The Finished of a request answered before routing: `model` is its pool's when it
        was known (refused by a limit or shed), else "" (never the string the client sent:
        it may be anything)."""
        finished = self._emit.finished
        if finished is not None:
            finished(
                Finished(
                    request_id=request_id,
                    at=self._clock(),
                    model=model,
                    started=started,
                    status=status,
                    backend=NO_BACKEND,
                    outcome=outcome,
                    ttft_s=None,
                    output_tokens=None,
                )
            )
