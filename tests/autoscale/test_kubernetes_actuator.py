"""The Kubernetes actuator, through the real client library (lightkube) and a kubeconfig file,
against a local HTTP server answering as the API server would, in the API's own JSON: the
scale subresource read and patched (with its resourceVersion as a precondition), the pods of
the scale's selector listed, the pods to remove annotated before the count comes down, and an
API error a warning, never an exception into the scaler's loop."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

from fleetgate.autoscale.kubernetes import KubernetesActuator, KubernetesActuatorSettings
from fleetgate.autoscale.recommender import AutoscaleSettings

SELECTOR = "app=vllm,tier in (gpu,spare)"  # as the API server writes a scale's status.selector
COST = "controller.kubernetes.io/pod-deletion-cost"


def pod(name: str, ip: str, owner: tuple[str, str], *, deleted: bool = False) -> dict[str, Any]:
    """A pod as the API server sends it; `owner`: its controller (kind, name)."""
    kind, owner_name = owner
    metadata: dict[str, Any] = {
        "name": name, "namespace": "llm", "resourceVersion": "7",
        "labels": {"app": "vllm", "tier": "gpu", "pod-template-hash": "5d8f"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": owner_name,
                             "uid": "u-" + owner_name, "controller": True}],
    }  # fmt: skip
    if deleted:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"kind": "Pod", "apiVersion": "v1", "metadata": metadata,
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
            "status": {"phase": "Running", "podIP": ip}}  # fmt: skip


@dataclass
class Api:
    """What the fake API server holds, and every request it was sent."""

    plural: str = "deployments"
    replicas: int = 3
    version: int = 10
    pods: list[dict[str, Any]] = field(default_factory=list)
    fail: int | None = None  # answer every request with this status
    rival: int | None = None  # another writer sets spec.replicas to this as a pod is patched
    requests: list[tuple[str, str, Any]] = field(default_factory=list)  # method, path, body

    def scale(self) -> dict[str, Any]:
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": "vllm", "namespace": "llm",
                             "resourceVersion": str(self.version)},
                "spec": {"replicas": self.replicas},
                "status": {"replicas": self.replicas, "selector": SELECTOR}}  # fmt: skip

    def annotated(self) -> dict[str, str]:
        """Each pod's deletion cost, of those that have one."""
        costs = {p["metadata"]["name"]: p["metadata"].get("annotations", {}).get(COST)
                 for p in self.pods}  # fmt: skip
        return {name: cost for name, cost in costs.items() if cost is not None}


def status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "code": code}  # fmt: skip


@pytest.fixture
def api() -> Iterator[tuple[Api, str]]:
    state = Api()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def answer(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            state.requests.append(("GET", url.path, parse_qs(url.query)))
            if state.fail is not None:
                self.answer(state.fail, status(state.fail, "refused"))
            elif url.path == f"/apis/apps/v1/namespaces/llm/{state.plural}/vllm/scale":
                self.answer(200, state.scale())
            elif url.path == "/api/v1/namespaces/llm/pods":
                assert parse_qs(url.query)["labelSelector"] == [SELECTOR]
                self.answer(200, {"kind": "PodList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": "7"},
                                  "items": state.pods})  # fmt: skip
            else:
                self.answer(404, status(404, "not found"))

        def do_PATCH(self) -> None:
            path = urlsplit(self.path).path
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            state.requests.append(("PATCH", path, body))
            assert self.headers["content-type"] == "application/merge-patch+json"
            if state.fail is not None:
                self.answer(state.fail, status(state.fail, "refused"))
            elif path == f"/apis/apps/v1/namespaces/llm/{state.plural}/vllm/scale":
                wanted = body.get("metadata", {}).get("resourceVersion")
                if wanted is not None and wanted != str(state.version):
                    self.answer(409, status(409, "the object has been modified"))
                    return
                state.replicas, state.version = body["spec"]["replicas"], state.version + 1
                self.answer(200, state.scale())
            elif path.startswith("/api/v1/namespaces/llm/pods/"):
                name = path.rsplit("/", 1)[1]
                [found] = [p for p in state.pods if p["metadata"]["name"] == name]
                found["metadata"].setdefault("annotations", {}).update(
                    body["metadata"]["annotations"]
                )
                if state.rival is not None:
                    state.replicas, state.version = state.rival, state.version + 1
                self.answer(200, found)
            else:
                self.answer(404, status(404, "not found"))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def actuator(
    url: str, tmp_path: Path, kind: str = "Deployment", clock: Clock | None = None
) -> KubernetesActuator:
    """An actuator whose kubeconfig file points at the fake API server."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": url}}],
        "users": [{"name": "test", "user": {}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }))  # fmt: skip
    settings = KubernetesActuatorSettings(namespace="llm", kind=kind, name="vllm",
                                          kubeconfig=str(kubeconfig))  # fmt: skip
    return KubernetesActuator(settings, clock=clock or Clock())


def deployment_pods() -> list[dict[str, Any]]:
    """Three pods of the Deployment `vllm`, one more being deleted, and another workload's
    that its selector picks too (selectors may overlap)."""
    mine = ("ReplicaSet", "vllm-5d8f")
    return [pod("vllm-5d8f-a", "10.2.0.1", mine), pod("vllm-5d8f-b", "10.2.0.2", mine),
            pod("vllm-5d8f-c", "10.2.0.3", mine),
            pod("vllm-5d8f-d", "10.2.0.4", mine, deleted=True),
            pod("other-77aa-x", "10.2.0.9", ("ReplicaSet", "other-77aa"))]  # fmt: skip


async def test_start_adds_replicas_to_the_scale_read_first(
    api: tuple[Api, str], tmp_path: Path
) -> None:
    state, url = api
    scaler = actuator(url, tmp_path)
    assert await scaler.start(2, 5) == 2
    assert state.replicas == 5
    scale = "/apis/apps/v1/namespaces/llm/deployments/vllm/scale"
    assert [(m, p) for m, p, _ in state.requests] == [("GET", scale), ("PATCH", scale)]
    assert state.requests[1][2] == {"metadata": {"resourceVersion": "10"},
                                    "spec": {"replicas": 5}}  # fmt: skip
    # Asked again while those pods start (not in the pool yet): nothing more.
    assert await scaler.start(2, 5) == 0 and state.replicas == 5
    scaler.close()


async def test_it_owns_the_pods_of_its_workload_by_ip_any_port(
    api: tuple[Api, str], tmp_path: Path
) -> None:
    state, url = api
    state.pods = deployment_pods()
    clock = Clock()
    scaler = actuator(url, tmp_path, clock=clock)

    def listings() -> int:
        return sum(1 for _, path, _ in state.requests if path.endswith("/pods"))

    assert not scaler.owns("10.2.0.1:8000")  # not listed yet: this starts the listing
    await scaler.refresh()  # ... which this waits for, starting none
    assert listings() == 1
    assert scaler.owns("10.2.0.1:8000") and scaler.owns("10.2.0.3:9000/v1")
    assert not scaler.owns("10.2.0.4:8000")  # being deleted
    assert not scaler.owns("10.2.0.9:8000")  # another workload's, though its selector picks it
    assert not scaler.owns("10.2.0.7:8000")
    state.pods.append(pod("vllm-5d8f-e", "10.2.0.5", ("ReplicaSet", "vllm-5d8f")))
    clock.now = 0.9
    assert not scaler.owns("10.2.0.5:8000")  # listed under a second ago: not again yet
    clock.now = 1.0
    scaler.owns("10.2.0.5:8000")  # a second: listed again
    await scaler.refresh()
    assert listings() == 2 and scaler.owns("10.2.0.5:8000")
    scaler.close()


async def test_stop_marks_exactly_those_pods_then_scales_down_by_their_count(
    api: tuple[Api, str], tmp_path: Path
) -> None:
    state, url = api
    state.pods = deployment_pods()
    scaler = actuator(url, tmp_path)
    await scaler.stop(["10.2.0.3:8000", "10.2.0.1:8000"])
    assert state.annotated() == {"vllm-5d8f-a": "-1000", "vllm-5d8f-c": "-1000"}
    assert state.replicas == 1
    patches = [p for m, p, _ in state.requests if m == "PATCH"]
    assert patches == ["/api/v1/namespaces/llm/pods/vllm-5d8f-a",
                       "/api/v1/namespaces/llm/pods/vllm-5d8f-c",
                       "/apis/apps/v1/namespaces/llm/deployments/vllm/scale"]  # fmt: skip
    # What deploy/kubernetes/base/rbac.yaml grants it (tests/deploy/test_manifests.py).
    assert {rbac(method, path) for method, path, _ in state.requests} == {
        ("apps", "deployments/scale", "get"), ("apps", "deployments/scale", "patch"),
        ("", "pods", "list"), ("", "pods", "patch"),
    }  # fmt: skip
    scaler.close()


def rbac(method: str, path: str) -> tuple[str, str, str]:
    """The (API group, resource, verb) an RBAC rule must grant for this request."""
    parts = path.strip("/").split("/")  # api/v1/... or apis/GROUP/VERSION/...
    group = "" if parts[0] == "api" else parts[1]
    after = parts[parts.index("namespaces") + 2 :]  # RESOURCE[/NAME[/SUBRESOURCE]]
    verb = "patch" if method == "PATCH" else "get" if len(after) > 1 else "list"
    return group, "/".join(after[:1] + after[2:]), verb


async def test_stop_leaves_what_is_not_its_own(api: tuple[Api, str], tmp_path: Path) -> None:
    state, url = api
    state.pods = deployment_pods()
    scaler = actuator(url, tmp_path)
    await scaler.stop(["10.2.0.2:8000", "10.2.0.9:8000"])  # the second: another workload's
    assert state.annotated() == {"vllm-5d8f-b": "-1000"}
    assert state.replicas == 2
    await scaler.stop(["10.2.0.9:8000"])
    assert state.replicas == 2 and [m for m, _, _ in state.requests].count("PATCH") == 2
    scaler.close()


async def test_a_statefulset_is_scaled_down_from_its_highest_ordinal_only(
    api: tuple[Api, str], tmp_path: Path
) -> None:
    state, url = api
    state.plural = "statefulsets"
    mine = ("StatefulSet", "vllm")
    state.pods = [pod(f"vllm-{i}", f"10.3.0.{i}", mine) for i in range(3)]
    scaler = actuator(url, tmp_path, kind="StatefulSet")
    await scaler.refresh()
    assert [scaler.owns(f"10.3.0.{i}:8000") for i in range(3)] == [False, False, True]
    await scaler.stop(["10.3.0.0:8000"])  # not the top: the StatefulSet would remove vllm-2
    assert state.replicas == 3
    await scaler.stop(["10.3.0.2:8000"])
    assert state.replicas == 2 and state.annotated() == {}  # no deletion cost: it has no use
    scaler.close()


@pytest.mark.parametrize(
    ("ordinals", "replicas", "owned"),
    [([1, 2, 3], 3, [False, False, True]),  # ordinals from 1 (spec.ordinals.start)
     ([0, 1], 3, [False, False])],  # vllm-2 still to come: vllm-1 is not the one that goes
)  # fmt: skip
async def test_a_statefulset_owns_its_highest_pod_once_every_replica_has_one(
    api: tuple[Api, str], tmp_path: Path, ordinals: list[int], replicas: int, owned: list[bool]
) -> None:
    state, url = api
    state.plural, state.replicas = "statefulsets", replicas
    state.pods = [pod(f"vllm-{i}", f"10.3.0.{i}", ("StatefulSet", "vllm")) for i in ordinals]
    scaler = actuator(url, tmp_path, kind="StatefulSet")
    await scaler.refresh()
    assert [scaler.owns(f"10.3.0.{i}:8000") for i in ordinals] == owned
    scaler.close()


@pytest.mark.parametrize("code", [500, 403])
async def test_an_api_error_is_a_warning_not_an_exception(
    api: tuple[Api, str], tmp_path: Path, code: int, caplog: pytest.LogCaptureFixture
) -> None:
    state, url = api
    state.fail = code
    scaler = actuator(url, tmp_path)
    with caplog.at_level(logging.WARNING, "fleetgate.autoscale"):
        assert await scaler.start(2, 5) == 0
        await scaler.stop(["10.2.0.1:8000"])
        await scaler.refresh()
    assert not scaler.owns("10.2.0.1:8000")
    assert f"llm/deployment/vllm not scaled up by 2: {code} refused" in caplog.text
    assert "not scaled down" in caplog.text and "its pods not listed" in caplog.text
    scaler.close()


async def test_a_count_changed_since_it_was_read_is_not_overwritten(
    api: tuple[Api, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state, url = api
    state.pods = deployment_pods()
    state.rival = 6  # an HPA, or another gateway, scales it up while the pods are marked
    scaler = actuator(url, tmp_path)
    with caplog.at_level(logging.WARNING, "fleetgate.autoscale"):
        await scaler.stop(["10.2.0.1:8000"])
    assert state.replicas == 6  # its count stands: the patch read at 3 was refused
    assert "not scaled down (10.2.0.1:8000): 409 the object has been modified" in caplog.text
    scaler.close()


async def test_an_unreachable_api_server_is_a_warning(tmp_path: Path) -> None:
    scaler = actuator("http://127.0.0.1:9", tmp_path)
    assert await scaler.start(1, 4) == 0
    await scaler.stop(["10.2.0.1:8000"])
    scaler.close()


@pytest.mark.parametrize(
    ("given", "says"),
    [({"name": "vllm", "kind": "ReplicaSet"}, "`kind` must be Deployment or StatefulSet"),
     ({"name": "vLLM_8b"}, "`name` must be a DNS-1123 name"),
     ({"name": "-vllm"}, "`name` must be a DNS-1123 name"),
     ({"name": "vllm", "namespace": "LLM"}, "`namespace` must be a DNS-1123 label"),
     ({"name": "vllm", "timeout_s": 0}, "`timeout_s` must be a finite number of seconds"),
     ({}, "missing required field `name`")],
)  # fmt: skip
def test_settings_it_cannot_use_are_refused(given: dict[str, Any], says: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=says):
        msgspec.convert(given, KubernetesActuatorSettings)


def test_one_actuator_at_most() -> None:
    both = {"local": {}, "kubernetes": {"name": "vllm"}}
    with pytest.raises(msgspec.ValidationError, match="`local` or `kubernetes`, not both"):
        msgspec.convert(both, AutoscaleSettings)
    settings = msgspec.convert({"kubernetes": {"name": "vllm"}}, AutoscaleSettings)
    assert settings.kubernetes == KubernetesActuatorSettings(name="vllm")
