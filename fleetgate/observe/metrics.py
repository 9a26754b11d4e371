"""The gateway's Prometheus metrics, in a registry of their own (no process-wide default),
kept from the request lifecycle's events (lifecycle/events.py).

Per request: a dictionary add and a bisect into a bucket list (observe/series.py, no locks);
in-flight gauges cost nothing per request because they are read from the pools' live state
when Prometheus scrapes. The overhead benchmark runs with all of it on.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import get_args

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetgate.autoscale.scaler import AutoscaleStatus
from fleetgate.discovery.reconcile import SourceStatus
from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.load_board import BackendLoad
from fleetgate.kv_events.status import FeedStatus
from fleetgate.lifecycle.events import (
    Admitted,
    AttemptEnded,
    Continued,
    Ejected,
    EjectReason,
    ErrorKind,
    Finished,
    FirstToken,
    GpuChanged,
    Hedged,
    Rejected,
    Retried,
    RetryRefused,
)
from fleetgate.lifecycle.hooks import Hooks
from fleetgate.observe.autoscale import autoscale_families
from fleetgate.observe.fleet_metrics import (
    admission_families,
    backend_families,
    discovery_families,
    gpu_expiry_family,
    gpu_families,
    kv_event_families,
    lease_families,
    load_families,
    shared_state_families,
    slo_families,
)
from fleetgate.observe.regions import Watched, region_families
from fleetgate.observe.reloads import ReloadStatus, reload_families
from fleetgate.observe.series import Buckets, CounterSeries, HistogramSeries
from fleetgate.observe.slo import ObjectiveStatus
from fleetgate.resilience.retry import RETRYABLE_STATUSES
from fleetgate.shared.state import LeaseStatus, SharedStatus
from fleetgate.traffic.admission import Admission
from fleetgate.traffic.priority import PRIORITY_NAMES

# Latency buckets (seconds) spanning a cached 5 ms TTFT to a queued 2-minute request.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75,
    1.0, 1.5, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
# Routing plugin time (seconds): a picker's microsecond to a large pool's scored millisecond.
ROUTING_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 1e-2)


# Attempts the gateway itself stopped or broke: no failure of talking to the backend at all.
_UNCOUNTED: frozenset[ErrorKind] = frozenset({"cancelled", "gateway"})
_ERROR_KINDS = tuple(k for k in get_args(ErrorKind) if k not in _UNCOUNTED)
_EJECT_REASONS: tuple[EjectReason, ...] = get_args(EjectReason)
# What a retried attempt got: a retryable status, or no answer at all.
_RETRY_REASONS = ("no_answer", *(str(s) for s in sorted(RETRYABLE_STATUSES)))
# The refusals a known tenant's requests can get, by their error code: those before its class
# is known (class "unknown") and those of its limits and of shedding (its class); and the one a
# request whose key was not read gets (tenant and class "unknown").
REFUSALS_BEFORE_CLASS = ("invalid_request", "model_not_found", "model_not_allowed")
REFUSALS_IN_CLASS = ("rate_limit_exceeded", "insufficient_quota", "overloaded", "queue_timeout")
UNKNOWN_CALLER_REFUSAL = "invalid_api_key"


class GatewayMetrics(Collector):
    """Everything the gateway records; `render()` gives the Prometheus text format.

    Every series the dashboard and the alert rules query is shown from the start, at 0, for
    the label values known then (each pool and backend, tenant, priority class, refusal reason
    and error kind): a counter that appears only at its first event reads "No data" where the
    truth is 0, and a rate over it is empty until two scrapes after that event. `tenants`:
    (name, priority class) of each tenant known from the config; `auth`: whether keys are
    checked (only then can a caller be unknown)."""

    def __init__(
        self,
        states: Callable[[], Iterable[tuple[str, BackendState]]],
        admissions: Callable[[], Iterable[tuple[str, Admission]]] = lambda: (),
        slo: Callable[[], Mapping[str, list[ObjectiveStatus]]] = dict,
        clock: Callable[[], float] = time.monotonic,
        usage: Callable[[], Mapping[tuple[str, str], list[float]]] = dict,
        tenants: Iterable[tuple[str, str]] = (),
        auth: bool = False,
        gpu_expiries: Callable[[], Iterable[tuple[str, BackendState, int]]] = lambda: (),
        loads: Callable[[], Iterable[tuple[str, str, BackendLoad]]] = lambda: (),
        shared: Callable[[], Iterable[SharedStatus]] = lambda: (),
        leases: Callable[[], Iterable[LeaseStatus]] = lambda: (),
        kv_events: Callable[[], Iterable[FeedStatus]] = lambda: (),
        discovery: Callable[[], Iterable[SourceStatus]] = lambda: (),
        reloads: Callable[[], ReloadStatus] | None = None,
        regions: Callable[[], Iterable[Watched]] = lambda: (),
        autoscale: Callable[[], Iterable[AutoscaleStatus]] = lambda: (),
    ) -> None:
        self._autoscale = autoscale  # each autoscaled pool's last decision
        self._regions = regions  # the gateway's region, per pool (observe/regions.py)
        self._reloads = reloads  # the config's reloads (fleetgate/reload.py); None: not served
        self._discovery = discovery  # the sources of backends found while running
        self._shared = shared  # the state shared with other gateways (shared/state.py)
        self._leases = leases  # ... and the leases among them
        self._kv_events = kv_events  # the engines' KV-event feeds (kv_events/feeds.py)
        self._states = states  # read when scraped (observe/fleet_metrics.py)
        self._loads = loads  # (model, backend id, its load board record), when scraped
        self.gpu_expiries = gpu_expiries  # health/gpu.py's GpuBoard.expiries, when scraped
        self._usage = usage  # tokens and spend per (pool, tenant): observe/usage.py's
        self._admissions = admissions
        self._slo = slo
        self._clock = clock
        self._admitted = CounterSeries(
            "fleetgate_admitted",
            "Requests let through to routing, by pool, tenant and priority class.",
            ["model", "tenant", "priority"],
        )
        self._rejected = CounterSeries(
            "fleetgate_rejected",
            "Requests refused before routing, by tenant, priority class and reason (the "
            "error's code: invalid_api_key, rate_limit_exceeded, insufficient_quota, "
            "overloaded, queue_timeout, ...).",
            ["tenant", "priority", "reason"],
        )
        self._requests = CounterSeries(
            "fleetgate_requests",
            "Requests answered, by model, backend and HTTP status.",
            ["model", "backend", "status"],
        )
        self._cache = CounterSeries(
            "fleetgate_cache_requests",
            "Requests the response cache keeps, by model and result: hit (answered from it), "
            "coalesced (by an identical request in flight), miss (a backend answered).",
            ["model", "result"],
        )
        self._errors = CounterSeries(
            "fleetgate_upstream_errors",
            "Failures talking to a backend, by kind (connect, read, protocol, timeout; and,"
            " never the backend's fault, client_timeout and local_resources).",
            ["model", "backend", "kind"],
        )
        self._retries = CounterSeries(
            "fleetgate_retries",
            "Attempts sent to another backend after one failed before the first byte, by what "
            "the failed attempt got: its HTTP status, or no_answer.",
            ["model", "reason"],
        )
        self._retries_refused = CounterSeries(
            "fleetgate_retries_refused",
            "Retries not sent as the pool's retry budget was spent: the client got the failure.",
            ["model"],
        )
        self._hedges = CounterSeries(
            "fleetgate_hedges",
            "Second attempts sent because a stream's first token was late, by the backend "
            "the second went to.",
            ["model", "backend"],
        )
        self._continuations = CounterSeries(
            "fleetgate_stream_continuations",
            "Streams whose backend failed mid-answer, continued on another backend, by the "
            "backend that took them over.",
            ["model", "backend"],
        )
        self._ejections = CounterSeries(
            "fleetgate_backend_ejections",
            "Backends taken out of routing by outlier detection, by the rule that fired "
            "(consecutive_failures, failure_rate, half_open).",
            ["model", "backend", "reason"],
        )
        self._gpu_changes = CounterSeries(
            "fleetgate_backend_gpu_changes",
            "Changes of a backend's GPU state as its GPU agent's readings judge it, by the new "
            "state: fault (out of routing), throttled (routed at a lower weight), ok, stale "
            "(no readings for pools[].gpu.stale_after_s: the last ones no longer count).",
            ["model", "backend", "state"],
        )
        self._queued = HistogramSeries(
            "fleetgate_admission_wait_seconds",
            "From a request's arrival to its admission into routing (its wait in the pool's "
            "queue, and the front door's checks), by pool and priority class.",
            ["model", "priority"],
            LATENCY_BUCKETS,
        )
        self._ttft = HistogramSeries(
            "fleetgate_time_to_first_token_seconds",
            "From the request's arrival to the first streamed chunk relayed.",
            ["model"],
            LATENCY_BUCKETS,
        )
        self._e2e = HistogramSeries(
            "fleetgate_request_duration_seconds",
            "From the request's arrival to its last byte relayed.",
            ["model"],
            LATENCY_BUCKETS,
        )
        self._routing = HistogramSeries(
            "fleetgate_routing_plugin_seconds",
            "Time each routing plugin took per pick (scoring and learning), by pool and plugin.",
            ["model", "plugin"],
            ROUTING_BUCKETS,
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._status_text: dict[int, str] = {}
        self._shown: set[tuple[str, str]] = set()  # (pool, backend) whose series are shown
        self._shown_pools: set[str] = set()
        self._tenants: tuple[tuple[str, str], ...] = ()
        self.know_tenants(tenants, auth)

    def know_tenants(self, tenants: Iterable[tuple[str, str]], auth: bool) -> None:
        """Show the series of these tenants (the config's, at start or reloaded) from zero;
        what was counted of any tenant stays."""
        self._tenants = tuple(tenants)
        rejected, admitted = self._rejected.values, self._admitted.values
        for tenant, priority in self._tenants:
            for reason in REFUSALS_BEFORE_CLASS:
                rejected.setdefault((tenant, "unknown", reason), 0.0)
            for reason in REFUSALS_IN_CLASS:
                rejected.setdefault((tenant, priority, reason), 0.0)
            for model in self._shown_pools:
                admitted.setdefault((model, tenant, priority), 0.0)
        if auth:
            rejected.setdefault(("unknown", "unknown", UNKNOWN_CALLER_REFUSAL), 0.0)

    def routing_timer(self, model: str) -> Callable[[str, float], None]:
        """What a pool's routing pipeline reports each plugin's time to (several times per
        request: each plugin's histogram is observed into directly)."""
        series = self._routing
        bounds = series.bounds
        by_plugin: dict[str, Buckets] = {}

        def timed(plugin: str, seconds: float) -> None:
            buckets = by_plugin.get(plugin)
            if buckets is None:
                buckets = by_plugin[plugin] = series.buckets((model, plugin))
            buckets.counts[bisect_left(bounds, seconds)] += 1
            buckets.sum += seconds

        return timed

    def subscribe(self, hooks: Hooks) -> None:
        hooks.subscribe(Admitted, self.on_admitted)
        hooks.subscribe(Rejected, self.on_rejected)
        hooks.subscribe(Finished, self.on_finished)
        hooks.subscribe(FirstToken, self.on_first_token)
        hooks.subscribe(AttemptEnded, self.on_attempt_ended)
        hooks.subscribe(Retried, self.on_retried)
        hooks.subscribe(RetryRefused, self.on_retry_refused)
        hooks.subscribe(Hedged, self.on_hedged)
        hooks.subscribe(Continued, self.on_continued)
        hooks.subscribe(Ejected, self.on_ejected)
        hooks.subscribe(GpuChanged, self.on_gpu_changed)

    # The per-request handlers below update the series' dicts and buckets inline: a method
    # call per series was a fifth of what metrics cost a request.

    def on_admitted(self, event: Admitted) -> None:
        model, priority = event.model, event.priority
        counts = self._admitted.values
        key = (model, event.tenant, priority)
        counts[key] = counts.get(key, 0.0) + 1.0
        wait = self._queued.buckets((model, priority))
        wait.counts[bisect_left(LATENCY_BUCKETS, event.queued_s)] += 1
        wait.sum += event.queued_s

    def on_rejected(self, event: Rejected) -> None:
        self._rejected.inc((event.tenant or "unknown", event.priority or "unknown", event.reason))

    def on_finished(self, event: Finished) -> None:
        status, model = event.status, event.model
        text = self._status_text.get(status)
        if text is None:
            text = self._status_text[status] = str(status)
        counts = self._requests.values
        key = (model, event.backend, text)
        counts[key] = counts.get(key, 0.0) + 1.0
        e2e = event.at - event.started
        took = self._e2e.buckets((model,))
        took.counts[bisect_left(LATENCY_BUCKETS, e2e)] += 1
        took.sum += e2e
        if event.cache:
            self._cache.inc((model, event.cache))

    def on_first_token(self, event: FirstToken) -> None:
        ttft = event.ttft_s
        if ttft is not None:
            first = self._ttft.buckets((event.model,))
            first.counts[bisect_left(LATENCY_BUCKETS, ttft)] += 1
            first.sum += ttft

    def on_attempt_ended(self, event: AttemptEnded) -> None:
        error = event.error
        if error is not None and error not in _UNCOUNTED:
            self._errors.inc((event.model, event.backend, error))

    def on_hedged(self, event: Hedged) -> None:
        self._hedges.inc((event.model, event.backend))

    def on_continued(self, event: Continued) -> None:
        self._continuations.inc((event.model, event.backend))

    def on_retried(self, event: Retried) -> None:
        status = event.status
        reason = self._status_text.get(status) if status else "no_answer"
        if reason is None:
            reason = self._status_text[status] = str(status)
        self._retries.inc((event.model, reason))

    def on_ejected(self, event: Ejected) -> None:
        self._ejections.inc((event.model, event.backend, event.reason))

    def on_gpu_changed(self, event: GpuChanged) -> None:
        self._gpu_changes.inc((event.model, event.backend, event.state))

    def on_retry_refused(self, event: RetryRefused) -> None:
        self._retries_refused.inc((event.model,))

    def _show_known(self, states: Iterable[tuple[str, BackendState]]) -> None:
        """Zeroes for the series of pools and backends not seen before (see the class)."""
        for model, state in states:
            backend = state.backend.id
            if (model, backend) in self._shown:
                continue
            self._shown.add((model, backend))
            for kind in _ERROR_KINDS:
                self._errors.values.setdefault((model, backend, kind), 0.0)
            for rule in _EJECT_REASONS:
                self._ejections.values.setdefault((model, backend, rule), 0.0)
            self._hedges.values.setdefault((model, backend), 0.0)
            self._continuations.values.setdefault((model, backend), 0.0)
            if model in self._shown_pools:
                continue
            self._shown_pools.add(model)
            for got in _RETRY_REASONS:
                self._retries.values.setdefault((model, got), 0.0)
            self._retries_refused.values.setdefault((model,), 0.0)
            self._ttft.buckets((model,))
            self._e2e.buckets((model,))
            for priority in PRIORITY_NAMES:
                self._queued.buckets((model, priority))
            for tenant, priority in self._tenants:
                self._admitted.values.setdefault((model, tenant, priority), 0.0)

    def collect(self) -> Iterator[Metric]:
        states = list(self._states())
        self._show_known(states)
        for series in (
            self._requests, self._errors, self._retries, self._retries_refused, self._hedges,
            self._continuations, self._ejections, self._gpu_changes, self._ttft, self._e2e,
            self._routing, self._admitted, self._queued, self._rejected, self._cache,
        ):  # fmt: skip
            yield series.family()
        yield from self._usage_families()
        yield from slo_families(self._slo())
        yield from admission_families(self._admissions())
        now = self._clock()
        yield from load_families(self._loads())
        yield from shared_state_families(self._shared())
        yield from lease_families(self._leases())
        yield from kv_event_families(self._kv_events())
        yield from discovery_families(self._discovery())
        yield from backend_families(states, now)
        yield from gpu_families(states, now)
        yield gpu_expiry_family(self.gpu_expiries())
        yield from region_families(self._regions())
        yield from autoscale_families(self._autoscale())
        if self._reloads is not None:
            yield from reload_families(self._reloads())

    def _usage_families(self) -> Iterator[Metric]:
        tokens = CounterMetricFamily(
            "fleetgate_tokens",
            "Tokens answered requests used, by pool, tenant and kind (prompt, completion): the "
            "engine's usage, or for a stream the estimated prompt and the tokens relayed.",
            labels=["model", "tenant", "kind"],
        )
        spend = CounterMetricFamily(
            "fleetgate_spend_usd",
            "What answered requests cost at their pool's prices (pools[].pricing), by pool and "
            "tenant.",
            labels=["model", "tenant"],
        )
        used: dict[tuple[str, str], Sequence[float]] = dict.fromkeys(
            ((model, tenant) for model in sorted(self._shown_pools) for tenant, _ in self._tenants),
            (0.0, 0.0, 0.0),
        )
        used.update(self._usage())
        for (model, tenant), (prompt, completion, usd) in used.items():
            tokens.add_metric([model, tenant, "prompt"], prompt)
            tokens.add_metric([model, tenant, "completion"], completion)
            spend.add_metric([model, tenant], usd)
        yield tokens
        yield spend

    def render(self) -> bytes:
        return generate_latest(self.registry)
