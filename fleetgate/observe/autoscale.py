"""Each autoscaled pool's last decision (autoscale/scaler.py), read when Prometheus scrapes:
`fleetgate_autoscale_desired_replicas` is the series KEDA or an HPA on an external metric
scales a workload by."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleetgate.autoscale.scaler import AutoscaleStatus

_GAUGES: tuple[tuple[str, str, Callable[[AutoscaleStatus], float]], ...] = (
    ("fleetgate_autoscale_desired_replicas",
     "The replicas the pool should run now (after stabilisation, steps, min/max and the "
     "schedule): scale the pool's workload to this.", lambda s: s.desired),
    ("fleetgate_autoscale_raw_replicas",
     "The replicas the pool's signals alone ask for (queue, prefill backlog, KV use, SLO "
     "burn), before stabilisation and limits.", lambda s: s.raw),
    ("fleetgate_autoscale_floor_replicas",
     "The least the pool may run now: min_replicas, or a scheduled peak's.", lambda s: s.floor),
    ("fleetgate_autoscale_replicas",
     "The pool's replicas serving now (members not draining).", lambda s: s.replicas),
    ("fleetgate_autoscale_draining_replicas",
     "Replicas being drained before the actuator removes them.", lambda s: len(s.draining)),
)  # fmt: skip


def autoscale_families(statuses: Iterable[AutoscaleStatus]) -> Iterator[Metric]:
    statuses = list(statuses)
    for name, doc, read in _GAUGES:
        gauge = GaugeMetricFamily(name, doc, labels=["model"])
        for status in statuses:
            gauge.add_metric([status.model], read(status))
        yield gauge
    scaled = CounterMetricFamily(
        "fleetgate_autoscale_scaled_replicas",
        "Replicas the actuator started (up) and removed after their drain (down).",
        labels=["model", "direction"],
    )
    for status in statuses:
        scaled.add_metric([status.model, "up"], status.scaled_up)
        scaled.add_metric([status.model, "down"], status.scaled_down)
    yield scaled
