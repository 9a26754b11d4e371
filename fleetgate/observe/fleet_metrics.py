"""The metrics read from the fleet's live state when Prometheus scrapes (nothing per request):
each backend's load, health and engine figures, each pool's admission queue, each pool's
objectives (observe/slo.py). The counters kept from events are in observe/metrics.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.engine_load import EngineLoad
from fleetgate.fleet.health import HealthFlag, Verdict
from fleetgate.observe.slo import ObjectiveStatus
from fleetgate.traffic.admission import Admission

# The per-backend gauges: name, help, and how each is read from a backend's live state.
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
    ("fleetgate_backend_weight",
     "A backend's effective routing weight: its configured weight x measured speed x its "
     "slow-start share.",
     lambda s: s.weight),
    ("fleetgate_backend_speed",
     "A backend's measured speed relative to its pool's fastest (1: the fastest).",
     lambda s: s.speed),
    ("fleetgate_backend_cost_per_hour_usd",
     "What a backend costs to run an hour (backends[].cost_per_hour_usd): summed, the fleet's "
     "burn rate; over the tokens served, the cost of a token.",
     lambda s: s.backend.cost_per_hour_usd),
)  # fmt: skip

# The engine's own figures, as last scraped (pools[].engine_metrics): present once scraped.
_ENGINE_GAUGES: tuple[tuple[str, str, Callable[[EngineLoad], float]], ...] = (
    ("fleetgate_backend_engine_running_requests",
     "Requests in a backend engine's running batch, as it last reported.",
     lambda e: e.running),
    ("fleetgate_backend_engine_waiting_requests",
     "Requests queued in a backend engine, as it last reported.",
     lambda e: e.waiting),
    ("fleetgate_backend_engine_kv_cache_usage_ratio",
     "Share of a backend engine's KV cache in use (0-1), as it last reported.",
     lambda e: e.kv_usage),
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

_FLAG_NAMES = tuple((flag, (flag.name or "").lower()) for flag in HealthFlag)


def backend_families(states: Iterable[tuple[str, BackendState]], now: float) -> Iterator[Metric]:
    """Every backend's gauges, its health as a state and flags, and its engine's figures."""
    states = list(states)
    labels = ["model", "backend"]
    for name, doc, read in _BACKEND_GAUGES:
        gauge = GaugeMetricFamily(name, doc, labels=labels)
        for model, state in states:
            gauge.add_metric([model, state.backend.id], read(state))
        yield gauge
    verdict = GaugeMetricFamily(
        "fleetgate_backend_state",
        "1 for a backend's health verdict now (healthy; degraded: backing off or ramping up "
        "after a return; unhealthy: a detector flags it), 0 for the others.",
        labels=[*labels, "state"],
    )
    flags = GaugeMetricFamily(
        "fleetgate_backend_flag",
        "1 while a health flag is set on a backend: active_check_failed, ejected (outlier "
        "detection), draining, gone (no longer discovered).",
        labels=[*labels, "flag"],
    )
    for model, state in states:
        key = [model, state.backend.id]
        now_verdict = state.verdict(now)
        for v in Verdict:
            verdict.add_metric([*key, v.value], 1.0 if v is now_verdict else 0.0)
        for flag, flag_name in _FLAG_NAMES:
            flags.add_metric([*key, flag_name], 1.0 if flag in state.flags else 0.0)
    yield verdict
    yield flags
    scraped = [(model, state, state.engine) for model, state in states if state.engine]
    for name, doc, pick in _ENGINE_GAUGES:
        gauge = GaugeMetricFamily(name, doc, labels=labels)
        for model, state, engine in scraped:
            gauge.add_metric([model, state.backend.id], pick(engine))
        yield gauge
    hits = CounterMetricFamily(
        "fleetgate_backend_engine_prefix_cache_hit_tokens",
        "Prompt tokens a backend engine found in its prefix cache, as it last reported "
        "(vLLM's counter; the hit rate is its rate over the queried one's).",
        labels=labels,
    )
    queries = CounterMetricFamily(
        "fleetgate_backend_engine_prefix_cache_queried_tokens",
        "Prompt tokens a backend engine looked up in its prefix cache, as it last reported.",
        labels=labels,
    )
    for model, state, engine in scraped:
        if engine.prefix_queries:
            hits.add_metric([model, state.backend.id], engine.prefix_hits)
            queries.add_metric([model, state.backend.id], engine.prefix_queries)
    yield hits
    yield queries


def admission_families(admissions: Iterable[tuple[str, Admission]]) -> Iterator[Metric]:
    admissions = list(admissions)
    for name, doc, pick in _ADMISSION_GAUGES:
        gauge = GaugeMetricFamily(name, doc, labels=["model"])
        for model, admission in admissions:
            gauge.add_metric([model], pick(admission))
        yield gauge


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
