"""The backends Kubernetes says serve a model: the endpoints of a Service's EndpointSlices, or
the pods a label selector picks, through lightkube (the `kubernetes` extra).

It lists, then watches from the list's resourceVersion, so each change arrives as it happens;
a watch the API server ends is taken up again from the last version seen, and one it answers
410 Gone (that version is too old) starts over with a new list, which replaces what was known
(whatever was deleted meanwhile goes). Readiness is honoured: an endpoint whose `ready`
condition is false (or that is terminating), or a pod whose Ready condition is not True, is
found not ready, and its backend drained, not used. While the API server cannot be reached
`read` says so (SourceError), and the reconciler keeps the last good set; it tries again
after 1 s, doubling to 30 s.

Needs RBAC to list and watch `endpointslices` (discovery.k8s.io) or `pods` in its namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.resources.core_v1 import Pod
from lightkube.resources.discovery_v1 import EndpointSlice
from lightkube.types import OnErrorAction, OnErrorResult

from fleetgate.discovery.found import Found, SourceError
from fleetgate.discovery.settings import KubernetesDiscovery

log = logging.getLogger("fleetgate.discovery")

FIRST_LIST_S = 5.0  # the first read waits this long for the first list
WATCH_S = 300  # each watch asks the server to end it after this (then it is taken up again)
QUIET_S = WATCH_S + 60  # a watch silent this long (its connection died unseen): list again
STEADY_S = 30.0  # a watch that lasted this long resets the backoff
BACKOFF_S = (1.0, 30.0)  # after a failure: the first wait, and the longest
SERVICE_LABEL = "kubernetes.io/service-name"


class Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


Resource = EndpointSlice | Pod


def _raise(error: Exception, count: int) -> OnErrorResult:
    """Every watch error to the caller: a 410 means listing again, not lightkube's retry
    without a version (which would miss what was deleted meanwhile)."""
    return OnErrorResult(OnErrorAction.RAISE)


def _name(obj: Resource) -> str:
    return (obj.metadata.name if obj.metadata is not None else None) or ""


class KubernetesSource:
    """The endpoints of one Service, or the pods of one selector, as backends of one model."""

    def __init__(self, config: KubernetesDiscovery, client: AsyncClient | None = None) -> None:
        self._config = config
        self._client = client
        self._objects: dict[str, Resource] = {}  # name -> its latest EndpointSlice or Pod
        self._listed = asyncio.Event()
        self._tried = asyncio.Event()  # the first list has succeeded or failed
        self._error: str | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        c = self._config
        what = f"service/{c.service}" if c.service else f"pods/{c.selector}"
        return f"kubernetes:{c.namespace or 'default'}/{what}"

    @property
    def interval_s(self) -> float:
        return self._config.interval_s

    async def read(self) -> Sequence[Found]:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        if not self._tried.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._tried.wait(), FIRST_LIST_S)
        if self._error is not None:
            raise SourceError(f"{self.name}: {self._error}")
        if not self._listed.is_set():
            raise SourceError(f"{self.name}: not listed within {FIRST_LIST_S:g} s")
        found: list[Found] = []
        for obj in self._objects.values():
            found += self._backends(obj)
        return found

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.close()

    # -- list and watch -----------------------------------------------------------------------

    async def _run(self) -> None:
        wait = BACKOFF_S[0]
        loop = asyncio.get_running_loop()
        while True:
            try:
                version = await self._list()
                started = loop.time()
                events = self._watch(version)
                try:
                    while True:  # an event within QUIET_S, else TimeoutError: list again
                        kind, obj = await asyncio.wait_for(anext(events), QUIET_S)
                        self._apply(kind, obj)
                        if loop.time() - started > STEADY_S:
                            wait = BACKOFF_S[0]
                finally:
                    with contextlib.suppress(Exception):
                        await events.aclose()
            except Gone:
                log.info("discovery: %s: its watch is too old, listing again", self.name)
            except TimeoutError:  # quiet for long: a stable Service, or a connection gone dead
                pass  # the next list tells which
            except Exception as exc:
                if self._error is None:
                    log.warning("discovery: %s failed, its last good set kept: %s", self.name,
                                exc)  # fmt: skip
                self._error = str(exc) or type(exc).__name__
                self._tried.set()
                await asyncio.sleep(wait)
                wait = min(BACKOFF_S[1], wait * 2)

    async def _list(self) -> str | None:
        client = self._connect()
        listing = client.list(self._kind(), namespace=self._namespace(), labels=self._labels())
        objects = {_name(obj): obj async for obj in listing}
        self._objects = objects
        self._error = None
        self._listed.set()
        self._tried.set()
        version: str | None = listing.resourceVersion
        return version

    async def _watch(self, version: str | None) -> AsyncGenerator[tuple[str, Resource]]:
        """The changes after `version`; Gone when the server answers 410."""
        events = self._connect().watch(
            self._kind(), namespace=self._namespace(), labels=self._labels(),
            resource_version=version, on_error=_raise, server_timeout=WATCH_S,
        )  # fmt: skip
        try:
            async for event in events:
                yield event
        except ApiError as exc:
            if exc.status.code == 410:
                raise Gone from None
            raise

    def _apply(self, kind: str, obj: Resource) -> None:
        name = _name(obj)
        if kind == "DELETED":
            self._objects.pop(name, None)
        else:  # ADDED, MODIFIED
            self._objects[name] = obj

    def _connect(self) -> AsyncClient:
        if self._client is None:
            c = self._config
            config = (
                KubeConfig.from_one(cluster=Cluster(server=c.api_server), user=User())
                if c.api_server
                else KubeConfig.from_env()
            )
            self._client = AsyncClient(config=config, namespace=c.namespace)
        return self._client

    def _kind(self) -> type[EndpointSlice] | type[Pod]:
        return EndpointSlice if self._config.service else Pod

    def _namespace(self) -> str | None:
        return self._config.namespace

    def _labels(self) -> dict[str, Any]:
        c = self._config
        if c.service:
            return {SERVICE_LABEL: c.service}
        pairs = (part.split("=", 1) for part in (c.selector or "").split(","))
        return {k.strip(): v.strip() for k, v in pairs}

    # -- what they become ---------------------------------------------------------------------

    def _backends(self, obj: Resource) -> list[Found]:
        return self._from_slice(obj) if isinstance(obj, EndpointSlice) else self._from_pod(obj)

    def _from_slice(self, slice_: EndpointSlice) -> list[Found]:
        c = self._config
        port = c.port
        for p in slice_.ports or ():
            if port is None and (c.port_name is None or p.name == c.port_name):
                port = p.port
        if port is None:  # said, so the last good set stays rather than the pool emptied
            raise SourceError(f"{self.name}: no port named {c.port_name!r} in {_name(slice_)}")
        found = []
        for endpoint in slice_.endpoints or ():
            conditions = endpoint.conditions
            # A condition the API leaves out reads as ready (the EndpointSlice API's rule).
            ready = conditions is None or (conditions.ready is not False
                                           and not conditions.terminating)  # fmt: skip
            for address in endpoint.addresses[:1]:  # one pod, one backend
                found.append(self._found(address, port, ready))
        return found

    def _from_pod(self, pod: Pod) -> list[Found]:
        status = pod.status
        if status is None or not status.podIP or self._config.port is None:
            return []
        if pod.metadata is not None and pod.metadata.deletionTimestamp is not None:
            return [self._found(status.podIP, self._config.port, False)]
        ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or ())
        return [self._found(status.podIP, self._config.port, ready)]

    def _found(self, address: str, port: int, ready: bool) -> Found:
        c = self._config
        host = f"[{address}]" if ":" in address else address
        return Found(model=c.model, url=f"{c.scheme}://{host}:{port}", labels=c.labels,
                     ready=ready)  # fmt: skip
