"""The Kubernetes source, through the real client library (lightkube), against a local HTTP
server answering as the API server would, with EndpointSlice lists and watch streams in the
API's own JSON: an endpoint turning not ready is drained, a deleted slice's endpoints go, a
410 Gone makes it list again (what was deleted meanwhile goes too), and an unreachable API
server is a SourceError."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from fleetgate.discovery.found import Found, SourceError
from fleetgate.discovery.kubernetes_source import KubernetesSource
from fleetgate.discovery.settings import KubernetesDiscovery

PATH = "/apis/discovery.k8s.io/v1/namespaces/llm/endpointslices"


def endpoint(ip: str, ready: bool | None = True, terminating: bool = False) -> dict[str, Any]:
    conditions: dict[str, Any] = {"serving": ready, "terminating": terminating}
    if ready is not None:
        conditions["ready"] = ready
    return {"addresses": [ip], "conditions": conditions, "nodeName": "node-1",
            "targetRef": {"kind": "Pod", "namespace": "llm", "name": f"vllm-{ip}"}}  # fmt: skip


def endpoint_slice(name: str, version: str, *endpoints: dict[str, Any]) -> dict[str, Any]:
    """An EndpointSlice as the API server sends it (kubectl get endpointslice -o json)."""
    return {
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"name": name, "namespace": "llm", "resourceVersion": version,
                     "labels": {"kubernetes.io/service-name": "vllm",
                                "endpointslice.kubernetes.io/managed-by":
                                    "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4", "endpoints": list(endpoints),
        "ports": [{"name": "metrics", "port": 9090, "protocol": "TCP"},
                  {"name": "http", "port": 8000, "protocol": "TCP"}],
    }  # fmt: skip


def listing(version: str, *slices: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"resourceVersion": version}, "items": list(slices)}  # fmt: skip


class Api:
    """What the fake API server answers: each list from `lists`, each watch from `watches`
    (its events, then the stream held open until its `released` event is set, then closed)."""

    def __init__(self) -> None:
        self.lists: list[dict[str, Any]] = []
        self.watches: list[list[dict[str, Any]]] = []
        self.released = [threading.Event() for _ in range(8)]  # the i-th watch's
        self.watched = 0
        self.seen: list[dict[str, list[str]]] = []  # each request's query
        self.path = PATH


@pytest.fixture
def api() -> Iterator[tuple[Api, str]]:
    state = Api()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            state.seen.append(query)
            if url.path != state.path or not (
                state.lists if "watch" not in query else state.watches
            ):
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            if "watch" not in query:
                self.wfile.write(json.dumps(state.lists.pop(0)).encode())
                return
            n, state.watched = state.watched, state.watched + 1
            for event in state.watches.pop(0):
                self.wfile.write(json.dumps(event).encode() + b"\n")
            state.released[n].wait(10)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    for event in state.released:
        event.set()
    server.shutdown()


async def settled(source: KubernetesSource, want: list[tuple[str, bool]]) -> None:
    """Wait (up to 5 s) until the source reads `want`: (url, ready) pairs."""
    for _ in range(100):
        found = [(f.url, f.ready) for f in await source.read()]
        if sorted(found) == sorted(want):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"read {found}, not {want}")


async def test_endpoint_slices_listed_then_watched_and_listed_again_on_410(
    api: tuple[Api, str],
) -> None:
    state, url = api
    a, b, c = "http://10.1.0.1:8000", "http://10.1.0.2:8000", "http://10.1.0.3:8000"
    state.lists = [
        listing("100", endpoint_slice("vllm-x", "99", endpoint("10.1.0.1"), endpoint("10.1.0.2"))),
        listing("200", endpoint_slice("vllm-x", "150", endpoint("10.1.0.1"))),
    ]
    state.watches = [
        [{"type": "MODIFIED", "object": endpoint_slice(
            "vllm-x", "101", endpoint("10.1.0.1"), endpoint("10.1.0.2", ready=False))},
         {"type": "ADDED", "object": endpoint_slice("vllm-y", "102", endpoint("10.1.0.3"))}],
        [{"type": "DELETED", "object": endpoint_slice("vllm-y", "103", endpoint("10.1.0.3"))},
         {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                      "message": "too old resource version: 103 (150)",
                                      "reason": "Expired", "code": 410}}],
        [],
    ]  # fmt: skip
    config = KubernetesDiscovery(model="m", service="vllm", namespace="llm", port_name="http",
                                 api_server=url, labels={"via": "k8s"})  # fmt: skip
    source = KubernetesSource(config)
    assert source.name == "kubernetes:llm/service/vllm"
    assert Found(model="m", url=a, labels={"via": "k8s"}) in await source.read()
    await settled(source, [(a, True), (b, False), (c, True)])  # the first watch's events
    state.released[0].set()  # the server ends the first watch: taken up again from version 102
    await settled(source, [(a, True)])  # vllm-y deleted, 410, listed again: B gone too
    watches = [q for q in state.seen if "watch" in q]
    assert [q.get("resourceVersion") for q in watches[:3]] == [["100"], ["102"], ["200"]]
    assert all(q["labelSelector"] == ["kubernetes.io/service-name=vllm"] for q in state.seen)
    await source.close()


async def test_a_condition_left_out_reads_ready_and_a_terminating_endpoint_not(
    api: tuple[Api, str],
) -> None:
    state, url = api
    state.lists = [listing("1", endpoint_slice(
        "vllm-x", "1", endpoint("10.1.0.1", ready=None), endpoint("10.1.0.2", terminating=True),
        endpoint("fd00::5")))]  # fmt: skip
    state.watches = [[]]
    config = KubernetesDiscovery(model="m", service="vllm", namespace="llm", port=8000,
                                 api_server=url)  # fmt: skip
    source = KubernetesSource(config)
    found = {f.url: f.ready for f in await source.read()}
    assert found == {"http://10.1.0.1:8000": True, "http://10.1.0.2:8000": False,
                     "http://[fd00::5]:8000": True}  # fmt: skip
    await source.close()


async def test_an_api_server_it_cannot_reach_is_a_source_error() -> None:
    config = KubernetesDiscovery(model="m", service="vllm", namespace="llm",
                                 api_server="http://127.0.0.1:9")  # fmt: skip
    source = KubernetesSource(config)
    with pytest.raises(SourceError, match="kubernetes:llm/service/vllm: "):
        await source.read()
    await source.close()


@pytest.mark.parametrize(
    ("config", "says"),
    [({"service": "a", "selector": "app=x"}, "give exactly one of `service` or `selector`"),
     ({}, "give exactly one of `service` or `selector`"),
     ({"selector": "app=x"}, "`port`: give the port"),
     ({"selector": "app", "port": 80}, "`selector` must be key=value"),
     ({"service": "a", "port": 70000}, "`port` must be in 1-65535")],
)  # fmt: skip
def test_a_source_it_cannot_use_is_refused(config: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        KubernetesDiscovery(model="m", **config)


def pod(name: str, ip: str, ready: str) -> dict[str, Any]:
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "llm", "resourceVersion": "7",
                         "labels": {"app": "vllm"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": ready}]}}  # fmt: skip


async def test_pods_by_label_selector_with_their_ready_condition(api: tuple[Api, str]) -> None:
    state, url = api
    state.path = "/api/v1/namespaces/llm/pods"
    state.lists = [
        {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "7"},
            "items": [pod("a", "10.2.0.1", "True"), pod("b", "10.2.0.2", "False")],
        }
    ]
    state.watches = [[]]
    config = KubernetesDiscovery(model="m", selector="app=vllm", namespace="llm", port=8000,
                                 api_server=url)  # fmt: skip
    source = KubernetesSource(config)
    assert source.name == "kubernetes:llm/pods/app=vllm"
    found = {f.url: f.ready for f in await source.read()}
    assert found == {"http://10.2.0.1:8000": True, "http://10.2.0.2:8000": False}
    assert state.seen[0]["labelSelector"] == ["app=vllm"]
    await source.close()
