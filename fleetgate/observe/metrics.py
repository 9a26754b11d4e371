"""The gateway's Prometheus metrics, in a registry of their own (no process-wide default),
kept from the request lifecycle's events (lifecycle/events.py).

Per request: a dictionary add and a bisect into a bucket list (observe/series.py, no locks);
in-flight gauges cost nothing per request because they are read from the pools' live state
when Prometheus scrapes. The overhead benchmark runs with all of it on.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetgate.fleet.backend import BackendState
from fleetgate.lifecycle.events import (
    Admitted,
    AttemptEnded,
    Charged,
    Continued,
    ErrorKind,
    Finished,
    FirstToken,
    Hedged,
    Rejected,
    Retried,
    RetryRefused,
)
from fleetgate.lifecycle.hooks import Hooks
from fleetgate.observe.series import Buckets, CounterSeries, HistogramSeries
from fleetgate.observe.slo import ObjectiveStatus
from fleetgate.traffic.admission import Admission

# Latency buckets (seconds) spanning a cached 5 ms TTFT to a queued 2-minute request.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75,
    1.0, 1.5, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
# Routing plugin time (seconds): a picker's microsecond to a large pool's scored millisecond.
ROUTING_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 1e-2)


# The per-backend gauges: name, help, and how each is read from a backend's live state.
# Attempts the gateway itself stopped or broke: no failure of talking to the backend at all.
_UNCOUNTED: frozenset[ErrorKind] = frozenset({"cancelled", "gateway"})
_BACKEND_GAUGES: tuple[tuple[str, str, Callable[[BackendState], float]], ...] = (
    ("fleetgate_backend_in_flight_requests",
     "Requests sent to a backend that have not finished.",
     lambda s: s.in_flight),
    ("fleetgate_backend_healthy",
     "1 when no health detector flags the backend (active check, ejection, draining).",
     lambda s: 0.0 if s.flags else 1.0),
    ("fleetgate_backend_pending_prefill_tokens",
     "Prompt tokens (estimated) sent to a backend whose first token has not come back.",
     lambda s: s.pending_prefill),
    ("fleetgate_backend_in_flight_tokens",
     "Prompt tokens (estimated) of the requests sent to a backend that have not finished.",
     lambda s: s.in_flight_tokens),
)  # fmt: skip


# The per-pool admission gauges: name, help, and how each is read from a pool's queue.
_ADMISSION_GAUGES: tuple[tuple[str, str, Callable[[Admission], float]], ...] = (
    ("fleetgate_admission_in_flight_requests",
     "Requests a pool's admission let through that have not finished.",
     lambda a: a.in_flight),
    ("fleetgate_admission_waiting_requests",
     "Requests waiting in a pool's admission queue.",
     lambda a: a.waiting),
    ("fleetgate_admission_limit_requests",
     "A pool's concurrency limit: past it requests wait (adaptive unless fixed).",
     lambda a: a.limit),
)  # fmt: skip


class GatewayMetrics(Collector):
    """Everything the gateway records; `render()` gives the Prometheus text format."""

    def __init__(
        self,
        states: Callable[[], Iterable[tuple[str, BackendState]]],
        admissions: Callable[[], Iterable[tuple[str, Admission]]] = lambda: (),
        slo: Callable[[], Mapping[str, list[ObjectiveStatus]]] = dict,
    ) -> None:
        self._states = states
        self._admissions = admissions
        self._slo = slo
        self._admitted = CounterSeries(
            "fleetgate_admitted",
            "Requests let through to routing, by pool, tenant and priority class.",
            ["model", "tenant", "priority"],
        )
        # What answered requests used, per (pool, tenant): [prompt, completion, spend]. One
        # cell per Charged event, not three series' increments (a request's 0.4 us).
        self._usage: dict[tuple[str, str], list[float]] = {}
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
        self._errors = CounterSeries(
            "fleetgate_upstream_errors",
            "Failures talking to a backend, by kind (connect, read, protocol, timeout; and,"
            " never the backend's fault, client_timeout and local_resources).",
            ["model", "backend", "kind"],
        )
        self._retries = CounterSeries(
            "fleetgate_retries",
            "Attempts sent to another backend after one failed before the first byte.",
            ["model"],
        )
        self._retries_refused = CounterSeries(
            "fleetgate_retries_refused",
            "Retries not sent as the pool's retry budget was spent: the client got the failure.",
            ["model"],
        )
        self._hedges = CounterSeries(
            "fleetgate_hedges",
            "Second attempts sent because a stream's first token was late.",
            ["model"],
        )
        self._continuations = CounterSeries(
            "fleetgate_stream_continuations",
            "Streams whose backend failed mid-answer, continued on another backend.",
            ["model"],
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
        hooks.subscribe(Charged, self.on_charged)
        hooks.subscribe(Finished, self.on_finished)
        hooks.subscribe(FirstToken, self.on_first_token)
        hooks.subscribe(AttemptEnded, self.on_attempt_ended)
        hooks.subscribe(Retried, self.on_retried)
        hooks.subscribe(RetryRefused, self.on_retry_refused)
        hooks.subscribe(Hedged, self.on_hedged)
        hooks.subscribe(Continued, self.on_continued)

    def on_admitted(self, event: Admitted) -> None:
        self._admitted.inc((event.model, event.tenant, event.priority))

    def on_charged(self, event: Charged) -> None:
        key = (event.model, event.tenant)
        cell = self._usage.get(key)
        if cell is None:
            cell = self._usage[key] = [0.0, 0.0, 0.0]
        cell[0] += event.prompt_tokens
        cell[1] += event.completion_tokens
        cell[2] += event.cost_usd

    def on_rejected(self, event: Rejected) -> None:
        self._rejected.inc((event.tenant or "unknown", event.priority or "unknown", event.reason))

    def on_finished(self, event: Finished) -> None:
        status = event.status
        text = self._status_text.get(status)
        if text is None:
            text = self._status_text[status] = str(status)
        self._requests.inc((event.model, event.backend, text))
        self._e2e.observe((event.model,), event.at - event.started)

    def on_first_token(self, event: FirstToken) -> None:
        if event.ttft_s is not None:
            self._ttft.observe((event.model,), event.ttft_s)

    def on_attempt_ended(self, event: AttemptEnded) -> None:
        error = event.error
        if error is not None and error not in _UNCOUNTED:
            self._errors.inc((event.model, event.backend.backend.id, error))

    def on_hedged(self, event: Hedged) -> None:
        self._hedges.inc((event.model,))

    def on_continued(self, event: Continued) -> None:
        self._continuations.inc((event.model,))

    def on_retried(self, event: Retried) -> None:
        self._retries.inc((event.model,))

    def on_retry_refused(self, event: RetryRefused) -> None:
        self._retries_refused.inc((event.model,))

    def collect(self) -> Iterator[Metric]:
        for series in (
            self._requests, self._errors, self._retries, self._retries_refused, self._hedges,
            self._continuations, self._ttft, self._e2e, self._routing, self._admitted,
            self._rejected,
        ):  # fmt: skip
            yield series.family()
        yield from self._usage_families()
        yield from slo_families(self._slo())
        admissions = list(self._admissions())
        for name, doc, pick in _ADMISSION_GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=["model"])
            for model, admission in admissions:
                gauge.add_metric([model], pick(admission))
            yield gauge
        states = list(self._states())
        for name, doc, read in _BACKEND_GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=["model", "backend"])
            for model, state in states:
                gauge.add_metric([model, state.backend.id], read(state))
            yield gauge

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
        for (model, tenant), (prompt, completion, usd) in self._usage.items():
            tokens.add_metric([model, tenant, "prompt"], prompt)
            tokens.add_metric([model, tenant, "completion"], completion)
            if usd:
                spend.add_metric([model, tenant], usd)
        yield tokens
        yield spend

    def render(self) -> bytes:
        return generate_latest(self.registry)


def slo_families(pools: Mapping[str, list[ObjectiveStatus]]) -> Iterator[Metric]:
    """Each pool's objectives (observe/slo.py) as gauges, and their verdicts as counters."""
    labels = ["model", "objective"]
    target = GaugeMetricFamily(
        "fleetgate_slo_target",
        "An objective's target: the share of requests that must be good (ratio objectives) "
        "or the bound on a mean in seconds (mean objectives).",
        labels=labels,
    )
    value = GaugeMetricFamily(
        "fleetgate_slo_value",
        "An objective's figure over its window (pools[].slo.window_s): the share of good "
        "requests, or the mean in seconds; absent with no requests in the window.",
        labels=labels,
    )
    met = GaugeMetricFamily(
        "fleetgate_slo_met",
        "1 while an objective's figure over its window meets it.",
        labels=labels,
    )
    burn = GaugeMetricFamily(
        "fleetgate_slo_burn_rate",
        "How fast an objective's error budget burns over a window: 1 spends it in exactly its "
        "period (a mean objective: its mean over the bound).",
        labels=[*labels, "window"],
    )
    alert = GaugeMetricFamily(
        "fleetgate_slo_alert",
        "1 while a multi-window burn-rate alert fires (SRE workbook: page at 14.4x over 1h "
        "and 5m or 6x over 6h and 30m; ticket at 3x over 24h and 2h).",
        labels=[*labels, "severity"],
    )
    judged = CounterMetricFamily(
        "fleetgate_slo_requests",
        "Requests judged by a ratio objective, by verdict (good, bad).",
        labels=[*labels, "verdict"],
    )
    for model, objectives in pools.items():
        for o in objectives:
            key = [model, o.name]
            target.add_metric(key, o.target)
            if o.value is not None:
                value.add_metric(key, o.value)
            met.add_metric(key, 1.0 if o.met else 0.0)
            for window, rate in o.burn.items():
                burn.add_metric([*key, window], rate)
            if o.kind == "ratio":
                for severity in ("page", "ticket"):
                    alert.add_metric([*key, severity], 1.0 if severity in o.alerts else 0.0)
                judged.add_metric([*key, "good"], o.good_total)
                judged.add_metric([*key, "bad"], o.bad_total)
    yield from (target, value, met, burn, alert, judged)
