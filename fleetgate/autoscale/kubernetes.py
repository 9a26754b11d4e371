"""The Kubernetes actuator: a pool's replicas are the pods of a Deployment or a StatefulSet,
whose count the gateway changes through the workload's scale subresource (lightkube, the
`kubernetes` extra, imported only when an actuator is made).

Up: spec.replicas + count; the new pods join the pool through discovery (`type: kubernetes`),
not through the actuator. Down: the scaler drains replicas the actuator owns and stops them
once they have left the pool (autoscale/scaler.py). A Deployment's ReplicaSet removes the
pods of lowest `controller.kubernetes.io/pod-deletion-cost` first, so each stopped replica's
pod is given -1000 before spec.replicas comes down by their count: exactly the drained pods
go. A StatefulSet always removes its highest ordinal, whatever it is told: the actuator owns
only that pod (once every replica has its pod), so the scaler drains and removes one replica
at a time, from the top, however many the recommender would remove.

Every change carries the resourceVersion it was read at: one another writer (an HPA, another
gateway) made meanwhile is refused (409) rather than overwritten. Every failure (an API error,
an unreachable server, a timeout) is a warning and changes nothing: the scaler's loop never
sees it, and asks again at its next tick. RBAC (deploy/kubernetes/base/rbac.yaml): get and
patch `deployments/scale` or `statefulsets/scale`, list and patch `pods`, in `namespace`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetgate.settings import Settings, positive_seconds

if TYPE_CHECKING:
    from lightkube import AsyncClient
    from lightkube.core.client import LabelSelector
    from lightkube.resources.apps_v1 import DeploymentScale, StatefulSetScale
    from lightkube.resources.core_v1 import Pod
    from lightkube.types import PatchType

log = logging.getLogger("fleetgate.autoscale")

KINDS = ("Deployment", "StatefulSet")
# Below every other pod's (0 unless set): the ReplicaSet deletes these first.
FIRST_OUT = {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-1000"}}}
REFRESH_S = 1.0  # `owns` lists the pods again at most this often
# DNS-1123: a subdomain (a Deployment's or StatefulSet's name) and a label (a namespace).
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*").fullmatch
# One requirement of a selector as the API server writes it (labels.Selector's String):
# `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`.
_REQUIREMENT = re.compile(
    r"(?P<not>!)?(?P<key>[\w./-]+)"
    r"(?:(?P<op>==|=|!=)(?P<value>[\w.-]*)|\s+(?P<set>in|notin)\s+\((?P<values>[^)]*)\))?"
).fullmatch
_COMMA_OUTSIDE_PARENTHESES = re.compile(r",(?![^(]*\))")


class ActuatorUnavailable(RuntimeError):
    """The actuator cannot be made: lightkube is not installed, or no kubeconfig was read."""


class KubernetesActuatorSettings(Settings, frozen=True):
    """`pools[].autoscale.kubernetes`: the workload whose pods are the pool's replicas."""

    name: str  # the workload's
    namespace: str = "default"
    kind: str = "Deployment"  # or StatefulSet
    kubeconfig: str | None = None  # None: in-cluster (outside one, $KUBECONFIG or ~/.kube/config)
    timeout_s: float = 10.0  # each scale-up or scale-down, its reads and patches together

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"`kind` must be Deployment or StatefulSet, got {self.kind!r}")
        if len(self.name) > 253 or not _SUBDOMAIN(self.name):
            raise ValueError(
                "`name` must be a DNS-1123 name (lowercase letters, digits, '-' and '.', "
                f"at most 253), got {self.name!r}"
            )
        if len(self.namespace) > 63 or not re.fullmatch(_LABEL, self.namespace):
            raise ValueError(
                "`namespace` must be a DNS-1123 label (lowercase letters, digits and '-', "
                f"at most 63), got {self.namespace!r}"
            )
        positive_seconds("timeout_s", self.timeout_s)


@dataclass(frozen=True, slots=True)
class Workload:
    """The workload as last read: its spec.replicas, the resourceVersion that count was read
    at, and its pods the scaler may remove (by pod IP)."""

    replicas: int
    version: str | None
    owned: dict[str, str]  # pod IP (canonical) -> pod name


class KubernetesActuator:
    """Scales one Deployment or StatefulSet for one pool (module docstring)."""

    name = "kubernetes"

    def __init__(self, settings: KubernetesActuatorSettings, *, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._clock = clock
        self._client = _client(settings)
        self._last = Workload(replicas=0, version=None, owned={})  # none owned until listed
        self._listed_at = -math.inf
        self._listing: asyncio.Task[None] | None = None
        self._failing = False  # the last listing failed (its warning given)
        self._closing: asyncio.Task[None] | None = None

    @property
    def workload(self) -> str:
        s = self._settings
        return f"{s.namespace}/{s.kind.lower()}/{s.name}"

    def owns(self, backend: str) -> bool:
        """Whether `backend` ("ip:port") is a pod the scaler may remove: one of the workload's
        (a StatefulSet's highest ordinal alone). Answered from the last listing, which this
        starts anew when it is over REFRESH_S old: a pod newer than that is not owned yet."""
        if self._clock() - self._listed_at >= REFRESH_S and not self._listing_now():
            self._listing = asyncio.get_running_loop().create_task(self._list())
        return _host(backend) in self._last.owned

    async def refresh(self) -> None:
        """List the workload's pods now, or wait for the listing under way."""
        if not self._listing_now():
            self._listing = asyncio.get_running_loop().create_task(self._list())
        assert self._listing is not None
        await asyncio.shield(self._listing)

    async def start(self, count: int, desired: int) -> int:
        """spec.replicas up to `desired` (never down: pods still starting are not in the pool
        yet, and asking for `count` more on each tick while they load would grow the workload
        past its maximum): how many it added, 0 when none were missing or the API refused or
        could not be reached (a warning said why)."""
        try:
            async with asyncio.timeout(self._settings.timeout_s):
                scale = await self._client.get(self._scale_kind(), self._settings.name)
                replicas, version = _replicas(scale)
                if desired <= replicas:
                    return 0  # asked for already: its pods are on their way
                await self._scale_to(desired, version)
        except Exception as exc:  # the scaler's loop must not see it: it asks again next tick
            log.warning("autoscale: %s not scaled up by %d: %s", self.workload, count, _why(exc))
            return 0
        log.info("autoscale: %s scaled %d -> %d", self.workload, replicas, desired)
        return desired - replicas

    async def stop(self, backends: Sequence[str]) -> None:
        """Remove the pods of these replicas (drained, out of the pool): each marked to go
        first, then spec.replicas - their count. One the workload no longer owns is left."""
        s = self._settings
        try:
            async with asyncio.timeout(s.timeout_s):
                workload = self._last = await self._read()  # as it is now, not as owned
                ips = {_host(b) for b in backends}
                pods = sorted(workload.owned[ip] for ip in ips if ip in workload.owned)
                if len(pods) < len(ips):
                    log.warning("autoscale: %s: of %s, only the pods %s are its to remove",
                                self.workload, sorted(backends), pods)  # fmt: skip
                if not pods:
                    return
                if s.kind == "Deployment":  # a StatefulSet removes its highest ordinal anyway
                    for pod in pods:
                        await self._client.patch(_pod_kind(), pod, FIRST_OUT, patch_type=_merge())
                await self._scale_to(workload.replicas - len(pods), workload.version)
        except Exception as exc:  # the scaler's loop must not see it (module docstring)
            log.warning("autoscale: %s not scaled down (%s): %s", self.workload,
                        ", ".join(backends), _why(exc))  # fmt: skip
            return
        log.info("autoscale: %s scaled %d -> %d, removing %s", self.workload, workload.replicas,
                 workload.replicas - len(pods), ", ".join(pods))  # fmt: skip

    def close(self) -> None:
        """Nothing to stop: the pods are Kubernetes', and stay. The client's connections
        close."""
        if self._listing is not None:
            self._listing.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop left: its connections went with it
            return
        self._closing = loop.create_task(self._client.close())

    # -- the API ------------------------------------------------------------------------------

    def _listing_now(self) -> bool:
        return self._listing is not None and not self._listing.done()

    async def _list(self) -> None:
        self._listed_at = self._clock()
        try:
            async with asyncio.timeout(self._settings.timeout_s):
                self._last = await self._read()
        except Exception as exc:  # owns() goes on answering from the last listing
            if not self._failing:
                log.warning("autoscale: %s: its pods not listed, the last listing kept: %s",
                            self.workload, _why(exc))  # fmt: skip
            self._failing = True
            return
        if self._failing:
            log.warning("autoscale: %s: its pods listed again", self.workload)
        self._failing = False

    async def _read(self) -> Workload:
        """The workload's scale, and those of its pods the scaler may remove."""
        s = self._settings
        scale = await self._client.get(self._scale_kind(), s.name)
        replicas, version = _replicas(scale)
        selector = scale.status.selector if scale.status is not None else None
        if not selector:
            raise ValueError("its scale subresource gives no selector")
        listed = self._client.list(_pod_kind(), labels=_labels(selector))
        pods = [pod async for pod in listed if self._its_own(pod)]
        if s.kind == "StatefulSet":
            # Its controller removes the highest ordinal: that pod alone, and only once every
            # replica has its pod (while one is still to come, the highest there is not the
            # one that would go). Its own highest, not `replicas - 1`: ordinals may start at N.
            settled = len(pods) == replicas and all(_ordinal(p) is not None for p in pods)
            pods = [max(pods, key=lambda p: _ordinal(p) or 0)] if settled and pods else []
        owned = {}
        for pod in pods:
            if pod.metadata is not None and pod.status is not None and pod.status.podIP:
                owned[_ip(pod.status.podIP)] = pod.metadata.name or ""
        return Workload(replicas=replicas, version=version, owned=owned)

    def _its_own(self, pod: Pod) -> bool:
        """One of the workload's own pods (not only one its selector picks: selectors may
        overlap), not being deleted already. A Deployment's pods are its ReplicaSets', each
        named after it and their template's hash."""
        s, meta = self._settings, pod.metadata
        if meta is None or meta.deletionTimestamp is not None:
            return False
        owners = {(o.kind, o.name) for o in meta.ownerReferences or () if o.controller}
        if s.kind == "StatefulSet":
            return ("StatefulSet", s.name) in owners
        template_hash = (meta.labels or {}).get("pod-template-hash")
        return ("ReplicaSet", f"{s.name}-{template_hash}") in owners

    async def _scale_to(self, replicas: int, version: str | None) -> None:
        """spec.replicas = `replicas`, if the workload's resourceVersion is still `version`."""
        body: dict[str, object] = {"spec": {"replicas": replicas}}
        if version is not None:  # a precondition: 409 Conflict if it changed
            body["metadata"] = {"resourceVersion": version}
        await self._client.patch(self._scale_kind(), self._settings.name, body,
                                 patch_type=_merge())  # fmt: skip

    def _scale_kind(self) -> type[DeploymentScale] | type[StatefulSetScale]:
        from lightkube.resources.apps_v1 import DeploymentScale, StatefulSetScale

        return DeploymentScale if self._settings.kind == "Deployment" else StatefulSetScale


def _client(settings: KubernetesActuatorSettings) -> AsyncClient:
    try:
        from lightkube import AsyncClient, KubeConfig
    except ImportError:
        raise ActuatorUnavailable(
            "`pools[].autoscale.kubernetes` needs its client library: pip install"
            " 'fleetgate[kubernetes]'"
        ) from None
    path = settings.kubeconfig
    try:
        config = KubeConfig.from_env() if path is None else KubeConfig.from_file(path)
    except Exception as exc:  # lightkube's ConfigError, a YAML error, a missing variable
        where = "in-cluster (or ~/.kube/config)" if path is None else path
        raise ActuatorUnavailable(
            f"`pools[].autoscale.kubernetes`: no kubeconfig read from {where}: {_why(exc)}"
        ) from None
    return AsyncClient(config=config, namespace=settings.namespace, field_manager="fleetgate")


def _pod_kind() -> type[Pod]:
    from lightkube.resources.core_v1 import Pod

    return Pod


def _merge() -> PatchType:
    from lightkube.types import PatchType

    return PatchType.MERGE


def _replicas(scale: DeploymentScale | StatefulSetScale) -> tuple[int, str | None]:
    replicas = scale.spec.replicas if scale.spec is not None else None
    version = scale.metadata.resourceVersion if scale.metadata is not None else None
    return replicas or 0, version


def _ordinal(pod: Pod) -> int | None:
    """A StatefulSet's pod's ordinal, the end of its name (`vllm-2`)."""
    name = (pod.metadata.name if pod.metadata is not None else None) or ""
    number = name.rpartition("-")[2]
    return int(number) if number.isdigit() else None


def _host(backend: str) -> str:
    """The address of a backend id (`ip:port[/base]`, an IPv6 address unbracketed)."""
    return _ip(backend.partition("/")[0].rpartition(":")[0])


def _ip(address: str) -> str:
    """One spelling of an address (IPv6 has several); a host name as it is."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address


def _labels(selector: str) -> LabelSelector:
    """A selector as the API server writes it (a scale's status.selector) in lightkube's
    form; ValueError for one it cannot hold (a key twice)."""
    from lightkube import operators

    labels: LabelSelector = {}
    for text in _COMMA_OUTSIDE_PARENTHESES.split(selector):
        found = _REQUIREMENT(text.strip())
        if found is None or found["key"] in labels:
            raise ValueError(f"a selector it cannot read: {selector!r}")
        key, values = found["key"], [v.strip() for v in (found["values"] or "").split(",")]
        if found["not"]:
            labels[key] = operators.not_exists()
        elif found["op"] == "!=":
            labels[key] = operators.not_equal(found["value"])
        elif found["op"]:
            labels[key] = operators.equal(found["value"])
        elif found["set"] == "in":
            labels[key] = operators.in_(values)
        elif found["set"]:
            labels[key] = operators.not_in(values)
        else:
            labels[key] = operators.exists()
    return labels


def _why(exc: BaseException) -> str:
    """An API error's status code and message, else the exception's own words."""
    from lightkube import ApiError

    if isinstance(exc, ApiError):
        return f"{exc.status.code} {exc.status.message}"
    return str(exc) or type(exc).__name__
