"""The gateway's Prometheus metrics, in a registry of their own (no process-wide default).

Per request: a counter add and a histogram observation on labelled children resolved once and
cached; in-flight gauges cost nothing per request because they are read from the pools' live
state when Prometheus scrapes. The overhead benchmark runs with all of it on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetgate.fleet.backend import BackendState

NO_BACKEND = "none"  # the backend label of requests the gateway answered itself

# Latency buckets (seconds) spanning a cached 5 ms TTFT to a queued 2-minute request.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75,
    1.0, 1.5, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip


class _InFlight(Collector):
    def __init__(self, states: Callable[[], Iterable[tuple[str, BackendState]]]) -> None:
        self._states = states

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "fleetgate_backend_in_flight_requests",
            "Requests sent to a backend that have not finished.",
            labels=["model", "backend"],
        )
        for model, state in self._states():
            gauge.add_metric([model, state.backend.id], state.in_flight)
        yield gauge


class GatewayMetrics:
    """Everything the gateway records; `render()` gives the Prometheus text format."""

    def __init__(self, states: Callable[[], Iterable[tuple[str, BackendState]]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._requests = Counter(
            "fleetgate_requests",
            "Requests answered, by model, backend and HTTP status.",
            ["model", "backend", "status"],
            registry=self.registry,
        )
        self._errors = Counter(
            "fleetgate_upstream_errors",
            "Failures talking to a backend, by kind (connect, read, protocol).",
            ["model", "backend", "kind"],
            registry=self.registry,
        )
        self._ttft = Histogram(
            "fleetgate_time_to_first_token_seconds",
            "From the request's arrival to the first streamed chunk relayed.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._e2e = Histogram(
            "fleetgate_request_duration_seconds",
            "From the request's arrival to its last byte relayed.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_InFlight(states))
        self._request_children: dict[tuple[str, str, int], Counter] = {}
        self._ttft_children: dict[str, Histogram] = {}
        self._e2e_children: dict[str, Histogram] = {}

    def request_done(self, model: str, backend: str, status: int, seconds: float) -> None:
        key = (model, backend, status)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self._requests.labels(model, backend, status)
        child.inc()
        e2e = self._e2e_children.get(model)
        if e2e is None:
            e2e = self._e2e_children[model] = self._e2e.labels(model)
        e2e.observe(seconds)

    def first_token(self, model: str, seconds: float) -> None:
        ttft = self._ttft_children.get(model)
        if ttft is None:
            ttft = self._ttft_children[model] = self._ttft.labels(model)
        ttft.observe(seconds)

    def upstream_error(self, model: str, backend: str, kind: str) -> None:
        self._errors.labels(model, backend, kind).inc()  # rare: no cache needed

    def render(self) -> bytes:
        return generate_latest(self.registry)
