"""The config's reloads (fleetgate/reload.py), for the metrics: fleetgate_config_*."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


@dataclass(slots=True)
class ReloadStatus:
    """The reloads so far, for the metrics: fleetgate_config_*."""

    last_ok: bool = True  # the last reload took (true until one fails)
    last_success_at: float = 0.0  # wall-clock time of the config in use (its start, or reload)
    by_trigger: dict[tuple[str, str], int] = field(default_factory=dict)  # (via, result)

    def record(self, via: str, ok: bool, wall_time: float) -> None:
        key = (via, "success" if ok else "failure")
        self.by_trigger[key] = self.by_trigger.get(key, 0) + 1
        self.last_ok = ok
        if ok:
            self.last_success_at = wall_time


def reload_families(status: ReloadStatus) -> Iterator[Metric]:
    reloads = CounterMetricFamily(
        "fleetgate_config_reloads",
        "Config reloads asked for, by how (signal, file, admin) and result (success, failure: "
        "the config in use was kept).",
        labels=["via", "result"],
    )
    for (via, result), count in sorted(status.by_trigger.items()):
        reloads.add_metric([via, result], count)
    yield reloads
    yield GaugeMetricFamily(
        "fleetgate_config_last_reload_successful",
        "1 when the last reload took (or none was asked for), 0 when it was refused: the file "
        "and the config in use differ.",
        value=1.0 if status.last_ok else 0.0,
    )
    yield GaugeMetricFamily(
        "fleetgate_config_last_reload_success_timestamp_seconds",
        "When the config in use was taken (Unix time): the start, or the last reload that took.",
        value=status.last_success_at,
    )
