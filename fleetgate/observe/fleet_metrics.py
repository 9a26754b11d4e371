"""The metrics read from the fleet's live state when Prometheus scrapes (nothing per request):
each backend's load (its pool's load board), health and engine figures, each pool's admission
queue, each pool's objectives (observe/slo.py). The counters kept from events are in
observe/metrics.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleetgate.discovery.reconcile import SourceStatus
from fleetgate.fleet.backend import REGION, ZONE, BackendState
from fleetgate.fleet.engine_load import EngineLoad
from fleetgate.fleet.gpu import THROTTLE_REASONS, GpuReading
from fleetgate.fleet.health import HealthFlag, Verdict
from fleetgate.fleet.load_board import BackendLoad
from fleetgate.kv_events.status import FeedStatus
from fleetgate.observe.slo import ObjectiveStatus
from fleetgate.shared.state import LeaseStatus, SharedStatus
from fleetgate.traffic.admission import Admission

# The per-backend load gauges: name, help, and how each is read from its load board record.
_LOAD_GAUGES: tuple[tuple[str, str, Callable[[BackendLoad], float]], ...] = (
    ("fleetgate_backend_in_flight_requests",
     "Requests sent to a backend that have not finished.",
     lambda load: load.in_flight),
    ("fleetgate_backend_pending_prefill_tokens",
     "Prompt tokens (estimated) sent to a backend whose first token has not come back.",
     lambda load: load.pending_prefill),
    ("fleetgate_backend_in_flight_tokens",
     "Prompt tokens (estimated) of the requests sent to a backend that have not finished.",
     lambda load: load.in_flight_tokens),
)  # fmt: skip

# The per-backend gauges: name, help, and how each is read from a backend's live state.
_BACKEND_GAUGES: tuple[tuple[str, str, Callable[[BackendState], float]], ...] = (
    ("fleetgate_backend_healthy",
     "1 when no health detector flags the backend (active check, ejection, draining).",
     lambda s: 0.0 if s.flags else 1.0),
    ("fleetgate_backend_weight",
     "A backend's effective routing weight: its configured weight x measured speed x its "
     "slow-start share x its throttle share (pools[].gpu.throttled_weight while throttling).",
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

# Each GPU's gauges, from its agent's last reading (health/gpu.py): absent where NVML could
# not read the field. Labels model, backend and gpu (its index on the host: bounded).
_GPU_GAUGES: tuple[tuple[str, str, Callable[[GpuReading], float | None]], ...] = (
    ("fleetgate_backend_gpu_temperature_celsius",
     "A GPU's temperature, as its agent last read it.",
     lambda r: r.temperature_c),
    ("fleetgate_backend_gpu_utilization_ratio",
     "Share of the last sample period a kernel ran on a GPU (NVML's gpu utilization).",
     lambda r: None if r.utilization_gpu_pct is None else r.utilization_gpu_pct / 100),
    ("fleetgate_backend_gpu_memory_utilization_ratio",
     "Share of the last sample period a GPU's memory was read or written.",
     lambda r: None if r.utilization_memory_pct is None else r.utilization_memory_pct / 100),
    ("fleetgate_backend_gpu_memory_used_bytes",
     "A GPU's memory in use.",
     lambda r: r.memory_used_bytes),
    ("fleetgate_backend_gpu_memory_total_bytes",
     "A GPU's memory.",
     lambda r: r.memory_total_bytes),
    ("fleetgate_backend_gpu_power_watts",
     "A GPU's power draw.",
     lambda r: r.power_draw_w),
    ("fleetgate_backend_gpu_power_limit_watts",
     "A GPU's enforced power limit.",
     lambda r: r.power_limit_w),
    ("fleetgate_backend_gpu_sm_clock_hertz",
     "A GPU's SM clock.",
     lambda r: None if r.sm_clock_mhz is None else r.sm_clock_mhz * 1e6),
    ("fleetgate_backend_gpu_memory_clock_hertz",
     "A GPU's memory clock.",
     lambda r: None if r.memory_clock_mhz is None else r.memory_clock_mhz * 1e6),
)  # fmt: skip
# The GPU's own running counts (volatile ECC: since its driver loaded).
_GPU_COUNTERS: tuple[tuple[str, str, Callable[[GpuReading], int | None]], ...] = (
    ("fleetgate_backend_gpu_ecc_uncorrected_errors",
     "Uncorrected (double-bit) ECC errors of a GPU since its driver loaded, as last read.",
     lambda r: r.ecc_uncorrected),
    ("fleetgate_backend_gpu_ecc_corrected_errors",
     "Corrected (single-bit) ECC errors of a GPU since its driver loaded, as last read.",
     lambda r: r.ecc_corrected),
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


def load_families(loads: Iterable[tuple[str, str, BackendLoad]]) -> Iterator[Metric]:
    """Every backend's in-flight gauges: (model, backend id, its record on the load board)."""
    loads = list(loads)
    for name, doc, read in _LOAD_GAUGES:
        gauge = GaugeMetricFamily(name, doc, labels=["model", "backend"])
        for model, backend, load in loads:
            gauge.add_metric([model, backend], read(load))
        yield gauge


# The shared state's counters (shared/state.py): name, help, and how each is read.
_SHARED_COUNTERS: tuple[tuple[str, str, Callable[[SharedStatus], float]], ...] = (
    ("fleetgate_shared_state_sync_failures",
     "Syncs of a shared part that Redis did not answer.",
     lambda status: status.failures),
    ("fleetgate_shared_state_heard",
     "Other gateways' decisions a shared part applied here.",
     lambda status: status.heard),
    ("fleetgate_shared_state_dropped",
     "Decisions never told to the other gateways: more were queued while Redis was away "
     "than a part holds.",
     lambda status: status.dropped),
    ("fleetgate_shared_state_undecodable",
     "Other gateways' entries a shared part skipped: they did not decode.",
     lambda status: status.undecodable),
    ("fleetgate_shared_state_stale",
     "Other gateways' entries heard too late to apply (KV-event expectations older than 2 s "
     "when heard): the gateways' clocks disagree, or their syncs lag.",
     lambda status: status.stale),
)  # fmt: skip


def shared_state_families(statuses: Iterable[SharedStatus]) -> Iterator[Metric]:
    """How the state shared with other gateways through Redis is doing (state.url), by part
    (load_board, prefix_index, sessions, responses, engine_blocks) and pool (no samples when
    nothing is shared)."""
    statuses = list(statuses)
    labels = ["part", "model"]
    up = GaugeMetricFamily(
        "fleetgate_shared_state_up",
        "1 when a shared part's last sync reached Redis; 0 while it runs on this gateway's "
        "own state alone.",
        labels=labels,
    )
    for status in statuses:
        up.add_metric([status.part, status.pool], 1.0 if status.up else 0.0)
    yield up
    for name, doc, read in _SHARED_COUNTERS:
        counter = CounterMetricFamily(name, doc, labels=labels)
        for status in statuses:
            counter.add_metric([status.part, status.pool], read(status))
        yield counter


def lease_families(leases: Iterable[LeaseStatus]) -> Iterator[Metric]:
    """The leases among the gateways sharing Redis, by kind (batches: which gateway runs a
    shared batch directory's batches); no samples when none is taken."""
    leases = list(leases)
    held = GaugeMetricFamily(
        "fleetgate_shared_lease_held",
        "1 while this gateway holds the lease (for batches: it runs the batch directory's "
        "batches), else 0.",
        labels=["lease"],
    )
    failures = CounterMetricFamily(
        "fleetgate_shared_lease_failures",
        "Renewals of the lease that Redis did not answer in time.",
        labels=["lease"],
    )
    for lease in leases:
        held.add_metric([lease.kind], 1.0 if lease.held else 0.0)
        failures.add_metric([lease.kind], lease.failures)
    yield held
    yield failures


# Each engine's KV-event feed (kv_events/feeds.py): name, help, and how each is read.
_FEED_COUNTERS: tuple[tuple[str, str, Callable[[FeedStatus], float]], ...] = (
    ("fleetgate_kv_events_batches",
     "KV-event batches applied from a backend's engine, replayed ones included.",
     lambda feed: feed.batches),
    ("fleetgate_kv_events_undecodable",
     "KV-event messages from a backend's engine that did not decode (skipped).",
     lambda feed: feed.undecodable),
    ("fleetgate_kv_events_restarts",
     "Times a backend's event sequence started again: its engine restarted, its blocks "
     "were forgotten.",
     lambda feed: feed.restarts),
)  # fmt: skip


# Each discovery source's series (discovery/reconcile.py): kind, name, help, how it is read.
_SOURCE_SERIES: tuple[
    tuple[type[GaugeMetricFamily | CounterMetricFamily], str, str, Callable[[SourceStatus], float]],
    ...,
] = (
    (GaugeMetricFamily, "fleetgate_discovery_source_up",
     "1 when a discovery source's last read succeeded; 0 while it fails (its last good set "
     "of backends is kept).",
     lambda source: 1.0 if source.up else 0.0),
    (GaugeMetricFamily, "fleetgate_discovery_backends",
     "Backends in a discovery source's last good set.",
     lambda source: source.backends),
    (CounterMetricFamily, "fleetgate_discovery_failures",
     "Reads of a discovery source that failed (unreachable, or an answer that did not parse).",
     lambda source: source.failures),
)  # fmt: skip


def discovery_families(sources: Iterable[SourceStatus]) -> Iterator[Metric]:
    """The discovery sources, by name (no samples when none is configured)."""
    sources = list(sources)
    for family, name, doc, read in _SOURCE_SERIES:
        metric = family(name, doc, labels=["source"])
        for source in sources:
            metric.add_metric([source.name], read(source))
        yield metric


def kv_event_families(feeds: Iterable[FeedStatus]) -> Iterator[Metric]:
    """The engines' KV-event feeds, by pool and backend (no samples when none publishes)."""
    feeds = list(feeds)
    labels = ["model", "backend"]
    for name, doc, read in _FEED_COUNTERS:
        counter = CounterMetricFamily(name, doc, labels=labels)
        for feed in feeds:
            counter.add_metric([feed.pool, feed.backend], read(feed))
        yield counter
    gaps = CounterMetricFamily(
        "fleetgate_kv_events_gaps",
        "Gaps in a backend's event sequence, by outcome: replayed from its replay socket, or "
        "lost (its blocks were forgotten).",
        labels=[*labels, "outcome"],
    )
    lag = GaugeMetricFamily(
        "fleetgate_kv_events_lag_seconds",
        "The last KV-event batch from a backend's engine: when it arrived less when the "
        "engine sent it (their clocks' offset included).",
        labels=labels,
    )
    blocks = GaugeMetricFamily(
        "fleetgate_kv_events_blocks",
        "KV-cache blocks a backend's engine holds, as its events tell.",
        labels=labels,
    )
    for feed in feeds:
        gaps.add_metric([feed.pool, feed.backend, "replayed"], feed.replayed)
        gaps.add_metric([feed.pool, feed.backend, "lost"], feed.lost)
        lag.add_metric([feed.pool, feed.backend], feed.lag_s)
        blocks.add_metric([feed.pool, feed.backend], feed.blocks)
    yield gaps
    yield lag
    yield blocks


def _placed(states: list[tuple[str, BackendState]]) -> Metric:
    """Where each backend is, to join its series by region or zone in a query."""
    info = GaugeMetricFamily(
        "fleetgate_backend_info",
        "1 for each backend, with where it is: its region and zone labels (empty: not said). "
        "Join it to sum a backend's series by region.",
        labels=["model", "backend", "region", "zone"],
    )
    for model, state in states:
        where = state.backend.labels
        info.add_metric([model, state.backend.id, where.get(REGION, ""), where.get(ZONE, "")], 1.0)
    return info


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
        "1 for a backend's health verdict now (healthy; degraded: backing off, ramping up "
        "after a return or its GPUs throttling; unhealthy: a detector flags it), 0 for the "
        "others.",
        labels=[*labels, "state"],
    )
    flags = GaugeMetricFamily(
        "fleetgate_backend_flag",
        "1 while a health flag is set on a backend: active_check_failed, ejected (outlier "
        "detection), draining, gone (removed; leaves when its last request ends), gpu_fault "
        "(its GPU agent's readings), unprobed (found by discovery, no good probe yet), "
        "region_drained (its region drained by the operator).",
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
    yield _placed(states)
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


def gpu_families(states: Iterable[tuple[str, BackendState]], now: float) -> Iterator[Metric]:
    """Each backend's GPUs as its agent last read them (nothing for a backend without one)."""
    read = [(model, state, state.gpus) for model, state in states if state.gpus is not None]
    labels = ["model", "backend", "gpu"]
    for family, specs in ((GaugeMetricFamily, _GPU_GAUGES), (CounterMetricFamily, _GPU_COUNTERS)):
        for name, doc, pick in specs:
            metric = family(name, doc, labels=labels)
            for model, state, gpus in read:
                for r in gpus.readings:
                    value = pick(r)
                    if value is not None:
                        metric.add_metric([model, state.backend.id, str(r.index)], value)
            yield metric
    xids = CounterMetricFamily(
        "fleetgate_backend_gpu_xid_errors",
        "XID critical errors a GPU's agent reported since the gateway started.",
        labels=labels,
    )
    throttled = GaugeMetricFamily(
        "fleetgate_backend_gpu_throttled",
        "1 while a GPU's clocks are held down for this reason (gpu_idle, sw_power_cap, "
        "hw_slowdown, sw_thermal, hw_thermal, hw_power_brake, ...), as last read.",
        labels=[*labels, "reason"],
    )
    lost = GaugeMetricFamily(
        "fleetgate_backend_gpu_lost", "1 when NVML reported the GPU lost.", labels=labels
    )
    age = GaugeMetricFamily(
        "fleetgate_backend_gpu_reading_age_seconds",
        "Seconds since a backend's GPU agent last sent readings.",
        labels=["model", "backend"],
    )
    for model, state, gpus in read:
        backend = state.backend.id
        age.add_metric([model, backend], now - gpus.at)
        for r in gpus.readings:
            key = [model, backend, str(r.index)]
            xids.add_metric(key, gpus.xid_totals.get(r.index, 0))
            lost.add_metric(key, 1.0 if r.lost else 0.0)
            if r.throttle_reasons is not None:
                for reason in THROTTLE_REASONS:
                    throttled.add_metric([*key, reason], 1.0 if reason in r.throttle_reasons
                                         else 0.0)  # fmt: skip
    yield from (xids, throttled, lost, age)


def gpu_expiry_family(expiries: Iterable[tuple[str, BackendState, int]]) -> Metric:
    """How many times each backend's GPU readings expired (health/gpu.py): every backend of a
    pool with `gpu.enabled`, from 0, so that an alert on its rate sees the first one."""
    expired = CounterMetricFamily(
        "fleetgate_backend_gpu_readings_expired",
        "Times a backend's GPU agent sent nothing for pools[].gpu.stale_after_s, so that its "
        "last readings were dropped and no longer judge it.",
        labels=["model", "backend"],
    )
    for model, state, count in expiries:
        expired.add_metric([model, state.backend.id], count)
    return expired


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
