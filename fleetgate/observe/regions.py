"""The gateway's region as each pool's `locality` filter sees it (routing/regions.py), read
when Prometheus scrapes: its phase, the share of its traffic it keeps and spills, the
requests that left it, its failovers and how long the last took, whether its standbys serve.
Per-region request counts and latencies come from the backend series joined to
`fleetgate_backend_info` (observe/fleet_metrics.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleetgate.routing.regions import LocalRegion, Phase

Watched = tuple[str, str, LocalRegion]  # (model, the gateway's region or "", its state)


def region_families(regions: Iterable[Watched]) -> Iterator[Metric]:
    regions = list(regions)
    labels = ["model", "region"]
    phase = GaugeMetricFamily(
        "fleetgate_region_phase",
        "1 for the phase the gateway's region is in for a pool (up; down: none of its backends "
        "can serve, its traffic goes to the next region; holding: back, proving itself; "
        "returning: taking its traffic back), 0 for the others.",
        labels=[*labels, "phase"],
    )
    gauges = (
        ("fleetgate_region_keep_share", "Of the requests routed here, the share that stays in "
         "the gateway's region (1: all; less while it spills, is down or returns).",
         lambda r: r.keep),
        ("fleetgate_region_spill_share", "Of the requests routed here, the share sent to the "
         "next region because the gateway's is saturated.", lambda r: r.spill),
        ("fleetgate_region_standbys_serving", "1 while the region's standby backends take "
         "traffic (its others are down, or it is saturated past standby_at).",
         lambda r: float(r.standbys)),
        ("fleetgate_region_last_failover_seconds", "How long the last failover took: from the "
         "region's first backend lost to all of it out of rotation.",
         lambda r: r.last_failover_s),
    )  # fmt: skip
    counters = (
        ("fleetgate_region_spilled_requests", "Requests sent out of the gateway's region while "
         "it spilled or returned.", lambda r: r.spilled),
        ("fleetgate_region_failovers", "Times the gateway's region went down and its traffic "
         "moved to the next region.", lambda r: r.failovers),
    )  # fmt: skip
    for model, name, region in regions:
        for each in Phase:
            phase.add_metric([model, name, each.value], float(region.phase is each))
    yield phase
    for metric, doc, read in gauges:
        gauge = GaugeMetricFamily(metric, doc, labels=labels)
        for model, name, region in regions:
            gauge.add_metric([model, name], read(region))
        yield gauge
    for metric, doc, read in counters:
        counter = CounterMetricFamily(metric, doc, labels=labels)
        for model, name, region in regions:
            counter.add_metric([model, name], read(region))
        yield counter
