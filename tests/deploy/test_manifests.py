"""deploy/kubernetes/ and deploy/docker/, checked with no cluster and no Docker daemon. Each
kustomization is rendered by kubectl's kustomize (Debian's kubectl 1.20 embeds kustomize v2.0,
newer ones v5: the files use only what both know); every object is validated offline against
Kubernetes' JSON schemas (kubernetes-validate) and the ServiceMonitor, a CRD it has no schema
for, by its shape here. What must agree with the gateway is checked against the gateway: the
ConfigMap's config loads with fleetgate's own loader, and a real gateway started from it (its
discovery finding a sim worker through a stand-in API server's EndpointSlices, its state and
limits in a real Redis, its keys in the Secret's format) answers the probes' and the
ServiceMonitor's paths. RBAC grants only what discovery reads, and what the Kubernetes actuator
calls; the pods run locked down."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import pytest
import yaml

from fleetgate.config import Config, parse_config
from fleetgate.discovery.settings import KubernetesDiscovery
from fleetgate.traffic.keys import read_key_file
from tests.debian import debian_program
from tests.e2e.procs import fleetgate, get, sim_workers, wait_ready
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
DIRECTORIES = ["base", "overlays/dev", "overlays/production"]
# The oldest and newest Kubernetes whose schemas kubernetes-validate ships: the manifests must
# be valid for both (docs/deployment.md says 1.25 or later).
KUBERNETES_VERSIONS = ("1.25", "1.37")
SERVICE_LABEL = "kubernetes.io/service-name"
KINDS = [
    "ConfigMap", "Deployment", "Deployment", "HorizontalPodAutoscaler", "NetworkPolicy",
    "PodDisruptionBudget", "Role", "Role", "RoleBinding", "RoleBinding", "Secret", "Service",
    "Service", "ServiceAccount", "ServiceMonitor",
]  # fmt: skip

Manifest = dict[str, Any]


@cache
def render(directory: str) -> tuple[Manifest, ...]:
    kubectl = debian_program("kubectl", "kubernetes-client")
    done = subprocess.run(
        [kubectl, "kustomize", str(KUSTOMIZE / directory)], capture_output=True, text=True
    )
    assert done.returncode == 0, f"kubectl kustomize {directory}:\n{done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


@pytest.fixture(params=DIRECTORIES)
def rendered(request: pytest.FixtureRequest) -> tuple[Manifest, ...]:
    return render(request.param)


def of_kind(objects: tuple[Manifest, ...], kind: str) -> list[Manifest]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: tuple[Manifest, ...], kind: str, name: str) -> Manifest:
    found = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"no single {kind} {name}"
    return found[0]


def gateway_pod(objects: tuple[Manifest, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gateway Deployment's pod spec and its container."""
    spec: dict[str, Any] = named(objects, "Deployment", "fleetgate")["spec"]["template"]["spec"]
    return spec, next(c for c in spec["containers"] if c["name"] == "gateway")


def port_number(container: dict[str, Any], port: int | str) -> int:
    """A port given by number or by the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    return next(int(p["containerPort"]) for p in container["ports"] if p["name"] == port)


def mounted_file(objects: tuple[Manifest, ...], path: str) -> str:
    """The text of the ConfigMap's or Secret's key that the gateway sees at `path`."""
    spec, container = gateway_pod(objects)
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    key = path.removeprefix(mount["mountPath"] + "/")
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    if "configMap" in volume:
        data: dict[str, str] = named(objects, "ConfigMap", volume["configMap"]["name"])["data"]
    else:
        data = named(objects, "Secret", volume["secret"]["secretName"])["stringData"]
    assert key in data, f"{path}: no key {key!r} in the volume {mount['name']}"
    return data[key]


def config_text(objects: tuple[Manifest, ...]) -> str:
    """The config.yaml the gateway's `--config` argument names."""
    _, container = gateway_pod(objects)
    args = container["args"]
    return mounted_file(objects, args[args.index("--config") + 1])


def gateway_config(objects: tuple[Manifest, ...]) -> Config:
    return parse_config(yaml.safe_load(config_text(objects)))


def prestop_sleep_s(container: dict[str, Any]) -> float:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    return float(command[1])


def check_service_monitor(monitor: Manifest, objects: tuple[Manifest, ...]) -> None:
    """What the Prometheus Operator needs of a ServiceMonitor, and that it finds the gateway's
    Service and a port of it by name."""
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    spec = monitor["spec"]
    assert set(spec) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    wanted = spec["selector"]["matchLabels"]
    assert set(spec["selector"]) == {"matchLabels"} and wanted
    services = [
        s for s in of_kind(objects, "Service")
        if wanted.items() <= s["metadata"].get("labels", {}).items()
        and s["metadata"].get("namespace") == monitor["metadata"].get("namespace")
    ]  # fmt: skip
    assert [s["metadata"]["name"] for s in services] == ["fleetgate"]
    port_names = {p["name"] for p in services[0]["spec"]["ports"]}
    assert spec["endpoints"]
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scheme", "scrapeTimeout"}
        assert endpoint["port"] in port_names
        assert endpoint.get("path", "/metrics").startswith("/")
        assert re.fullmatch(r"\d+[sm]", endpoint.get("interval", "30s"))


def test_every_object_renders_and_is_valid_for_kubernetes(rendered: tuple[Manifest, ...]) -> None:
    assert sorted(o["kind"] for o in rendered) == KINDS
    shipped = {v.rsplit(".", 1)[0] for v in kubernetes_validate.utils.all_versions()}
    assert set(KUBERNETES_VERSIONS) <= shipped, f"kubernetes-validate ships {sorted(shipped)}"
    for obj in rendered:
        if obj["kind"] == "ServiceMonitor":
            check_service_monitor(obj, rendered)
            continue
        for version in KUBERNETES_VERSIONS:
            try:  # strict: an unknown field (a typo) is an error, not ignored
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError as exc:  # a kind with no schema
                pytest.fail(exc.message)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']} ({version}): {path}: "
                            f"{exc.message}")  # fmt: skip
    namespaces = {o["metadata"].get("namespace") for o in rendered}
    assert len(namespaces) == 1, "every object in the overlay's one namespace"
    namespace = namespaces.pop() or "default"  # the base alone: kubectl's default
    for binding in of_kind(rendered, "RoleBinding"):
        assert all(s["namespace"] == namespace for s in binding["subjects"])


def test_the_config_loads_and_agrees_with_the_pod(
    rendered: tuple[Manifest, ...], tmp_path: Path
) -> None:
    config = gateway_config(rendered)  # fleetgate's own loader: a bad key or value fails here
    _, container = gateway_pod(rendered)
    port = config.server.port
    assert port_number(container, "http") == port
    assert port_number(container, container["livenessProbe"]["httpGet"]["port"]) == port
    assert port_number(container, container["readinessProbe"]["httpGet"]["port"]) == port
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    service = named(rendered, "Service", "fleetgate")
    deployment = named(rendered, "Deployment", "fleetgate")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert [port_number(container, p["targetPort"]) for p in service["spec"]["ports"]] == [port]
    assert config.server.host == "0.0.0.0" or "0.0.0.0" in container["args"]

    # The keys come from the Secret's file, whose owners are the config's tenants.
    assert config.auth_enabled and config.auth.key_file is not None
    keys = tmp_path / "keys"
    keys.write_text(mounted_file(rendered, config.auth.key_file))
    tenants = {t.name for t in config.tenants}
    owners = {owner for owner, _ in read_key_file(keys)}  # the gateway's own reader
    assert owners and owners <= tenants | {":admin", ":heartbeat"}

    # Shared state and limits in the Redis these manifests run, at its Service's port.
    redis_service = named(rendered, "Service", "fleetgate-redis")
    redis_port = redis_service["spec"]["ports"][0]["port"]
    for url in (config.state.url, config.limits.redis_url):
        assert url is not None
        parts = urlsplit(url)
        assert (parts.hostname, parts.port or 6379) == ("fleetgate-redis", redis_port)
    assert config.limits.store == "redis"

    # Discovery watches a Service in the gateway's own namespace, where the Role grants it.
    sources = [s for s in config.discovery if isinstance(s, KubernetesDiscovery)]
    assert sources and all(s.namespace is None and s.api_server is None for s in sources)
    assert {s.model for s in sources} == {p.model for p in config.pools}


def test_rbac_grants_discovery_only_what_it_reads(rendered: tuple[Manifest, ...]) -> None:
    config = gateway_config(rendered)
    needed = set()
    for source in config.discovery:
        if isinstance(source, KubernetesDiscovery):
            needed.add(("discovery.k8s.io", "endpointslices") if source.service else ("", "pods"))
    assert not of_kind(rendered, "ClusterRole") and not of_kind(rendered, "ClusterRoleBinding")
    role = named(rendered, "Role", "fleetgate-discovery")
    granted = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, "no resourceNames, no URLs"
        words = rule["apiGroups"] + rule["resources"] + rule["verbs"]
        assert "*" not in words and "secrets" not in rule["resources"]
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
        assert {"list", "watch"} <= set(rule["verbs"])  # what the source does
        granted |= {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == needed
    bound_to_the_gateway(rendered, "fleetgate-discovery")


def test_rbac_grants_the_kubernetes_actuator_only_what_it_calls(
    rendered: tuple[Manifest, ...],
) -> None:
    # The requests fleetgate/autoscale/kubernetes.py sends (its test's stand-in API server sees
    # them): GET and PATCH a workload's scale subresource, GET (list) and PATCH pods.
    calls = {("apps", "deployments/scale", "get"), ("apps", "deployments/scale", "patch"),
             ("apps", "statefulsets/scale", "get"), ("apps", "statefulsets/scale", "patch"),
             ("", "pods", "list"), ("", "pods", "patch")}  # fmt: skip
    role = named(rendered, "Role", "fleetgate-autoscale")
    granted = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}
        granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"]
                    for v in rule["verbs"]}  # fmt: skip
    assert granted == calls
    bound_to_the_gateway(rendered, "fleetgate-autoscale")


def bound_to_the_gateway(objects: tuple[Manifest, ...], role: str) -> None:
    """The Role `role` is bound, by the RoleBinding of its name, to the gateway's
    ServiceAccount alone."""
    binding = named(objects, "RoleBinding", role)
    spec, _ = gateway_pod(objects)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role}  # fmt: skip
    assert [(s["kind"], s["name"]) for s in binding["subjects"]] == [
        ("ServiceAccount", spec["serviceAccountName"])
    ]


def test_the_pods_run_locked_down(rendered: tuple[Manifest, ...]) -> None:
    for deployment in of_kind(rendered, "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] > 0
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"] == {"drop": ["ALL"]}
            for need in ("requests", "limits"):
                assert set(container["resources"][need]) == {"cpu", "memory"}
        assert "hostNetwork" not in spec and "hostPID" not in spec
    redis = named(rendered, "Deployment", "fleetgate-redis")["spec"]["template"]["spec"]
    assert redis["automountServiceAccountToken"] is False  # it talks to no API server

    config = gateway_config(rendered)
    deployment = named(rendered, "Deployment", "fleetgate")
    spec, container = gateway_pod(rendered)
    grace = spec["terminationGracePeriodSeconds"]
    assert grace > config.server.drain_timeout_s + prestop_sleep_s(container)
    tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in spec["volumes"] if v["name"] == tmp["name"])
    writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
    assert writable == ["/tmp"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert deployment["spec"]["replicas"] >= 2
    pdb = named(rendered, "PodDisruptionBudget", "fleetgate")
    assert 1 <= pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    hpa = named(rendered, "HorizontalPodAutoscaler", "fleetgate")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "fleetgate"
    assert hpa["spec"]["minReplicas"] == deployment["spec"]["replicas"]


def dockerfile() -> dict[str, list[str]]:
    """Each instruction's arguments (JSON form parsed), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    instructions: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            instructions.setdefault(word.upper(), []).append(rest.strip())
    return instructions


def test_the_image_runs_as_the_manifests_expect() -> None:
    docker = dockerfile()
    spec, container = gateway_pod(render("base"))
    config = gateway_config(render("base"))
    assert docker["USER"] == [f"{spec['securityContext']['runAsUser']}:"
                              f"{spec['securityContext']['runAsGroup']}"]  # fmt: skip
    assert json.loads(docker["ENTRYPOINT"][0]) == ["fleetgate"]
    assert json.loads(docker["CMD"][0]) == container["args"]  # one command, either way started
    assert any("PYTHONDONTWRITEBYTECODE=1" in env for env in docker["ENV"])
    healthcheck = docker["HEALTHCHECK"][0]
    assert f"http://127.0.0.1:{config.server.port}/healthz" in healthcheck
    assert "pip install '.[kubernetes]'" in " ".join(docker["RUN"])
    # The build context is what .dockerignore lets back in after `*`: exactly what is copied.
    copied = {src for c in docker["COPY"] if "--from" not in c for src in c.split()[:-1]}
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert "*" in ignore and {p[1:] for p in ignore if p.startswith("!")} == copied


# -- a real gateway from the ConfigMap's config ------------------------------------------------


def endpoint_slices(service: str, port_name: str, port: int) -> dict[str, Any]:
    """The API server's list of a Service's EndpointSlices: one ready endpoint on 127.0.0.1."""
    slice_ = {
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"name": f"{service}-x1", "namespace": "default", "resourceVersion": "7",
                     "labels": {SERVICE_LABEL: service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }  # fmt: skip
    return {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"resourceVersion": "7"}, "items": [slice_]}  # fmt: skip


@pytest.fixture
def api_server() -> Iterator[tuple[str, dict[str, dict[str, Any]]]]:
    """A stand-in Kubernetes API server: it lists the EndpointSlices the test puts in its
    table (by the Service their label selector names) and holds every watch open, quiet."""
    table: dict[str, dict[str, Any]] = {}
    closing = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            selector = query.get("labelSelector", [""])[0]
            service = selector.removeprefix(SERVICE_LABEL + "=")
            if not url.path.endswith("/endpointslices") or service not in table:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            if "watch" in query:
                closing.wait(60)
            else:
                self.wfile.write(json.dumps(table[service]).encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", table
    closing.set()
    server.shutdown()


def test_a_gateway_from_the_configmap_answers_its_probes_and_metrics_path(
    redis: RedisServer,
    api_server: tuple[str, dict[str, dict[str, Any]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = render("base")
    data = yaml.safe_load(config_text(objects))
    config = parse_config(data)
    [source] = [s for s in config.discovery if isinstance(s, KubernetesDiscovery)]
    assert source.service is not None and source.port_name is not None
    _, container = gateway_pod(objects)
    probes = [container["livenessProbe"]["httpGet"]["path"],
              container["readinessProbe"]["httpGet"]["path"]]  # fmt: skip
    [monitor] = of_kind(objects, "ServiceMonitor")
    metrics_path = monitor["spec"]["endpoints"][0].get("path", "/metrics")

    # What the cluster provides, here on 127.0.0.1: the API server, Redis, the Secret's file.
    url, table = api_server
    data["discovery"][0]["api_server"] = url
    data["state"]["url"] = data["limits"]["redis_url"] = redis.url
    key = "sk-deploy-test-0123456789"
    keys = tmp_path / "keys"
    keys.write_text(f"# as the Secret's file, with a key the test knows\nteam-a {key}\n")
    data["auth"]["key_file"] = str(keys)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    # As in the image: no bytecode written, and a home and working directory that must stay
    # empty (its root file system is read-only; only /tmp is writable).
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.chdir(work)

    model = config.pools[0].model
    with sim_workers(model, 1) as [worker]:
        table[source.service] = endpoint_slices(
            source.service, source.port_name, urlsplit(worker).port or 0
        )
        args = ["serve", "--config", str(path), "--host", "127.0.0.1", "--port", "0"]
        with fleetgate(args) as proc:
            port = proc.wait_for(r"listening on http://127\.0\.0\.1:(\d+)")[0]
            base = f"http://127.0.0.1:{port}"
            assert probes == ["/healthz", "/readyz"]
            assert get(base + probes[0])[0] == 200
            assert get(base + probes[1])[0] in (200, 503)
            wait_ready(base + probes[1])  # the vLLM Service's endpoint found and probed
            status, _, body = get(base + metrics_path)
            assert status == 200 and b"fleetgate_discovery_source_up" in body

            def chat(headers: dict[str, str]) -> int:
                request = urllib.request.Request(
                    base + "/v1/chat/completions",
                    json.dumps({"model": model, "max_tokens": 2,
                                "messages": [{"role": "user", "content": "hi"}]}).encode(),
                    {"content-type": "application/json", **headers},
                )  # fmt: skip
                try:
                    with urllib.request.urlopen(request, timeout=10) as response:
                        return int(response.status)
                except urllib.error.HTTPError as exc:
                    return exc.code

            assert chat({}) == 401
            assert chat({"authorization": f"Bearer {key}"}) == 200
            assert get(base + "/admin/backends")[0] == 404  # the admin API is off
            assert get(base + "/dashboard")[0] == 401  # it needs an admin key; none is given
    assert not list(home.iterdir()) and not list(work.iterdir()), "written to home or cwd"
