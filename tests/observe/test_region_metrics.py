"""The gateway's region's series (observe/regions.py), read from a LocalRegion's state."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from fleetgate.observe.regions import region_families
from fleetgate.routing.regions import LocalRegion, RecoveryParams, SpillParams


def test_a_failover_and_a_spill_read_as_series() -> None:
    region = LocalRegion(SpillParams(), RecoveryParams())
    region.update(2, 0.0, 0.0)
    region.update(1, 0.0, 1.0)
    region.update(0, 0.0, 1.5)
    region.spilled = 7

    class Regions(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            return region_families([("m", "eu", region)])

    registry = CollectorRegistry()
    registry.register(Regions())
    text = generate_latest(registry).decode()
    assert 'fleetgate_region_phase{model="m",phase="down",region="eu"} 1.0' in text
    assert 'fleetgate_region_phase{model="m",phase="up",region="eu"} 0.0' in text
    assert 'fleetgate_region_keep_share{model="m",region="eu"} 0.0' in text
    assert 'fleetgate_region_failovers_total{model="m",region="eu"} 1.0' in text
    assert 'fleetgate_region_last_failover_seconds{model="m",region="eu"} 0.5' in text
    assert 'fleetgate_region_spilled_requests_total{model="m",region="eu"} 7.0' in text
