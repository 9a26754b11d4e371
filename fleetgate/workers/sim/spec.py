"""What one simulated worker is: the model it serves, its engine profile, its port, faults."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetgate.workers.sim.faults import Faults
from fleetgate.workers.sim.profiles import KV_LINK_GBPS


@dataclass(frozen=True, slots=True)
class SimSpec:
    """One simulated worker: what it serves, on which engine profile, on which port."""

    model: str
    profile: str
    port: int = 0  # 0: any free port
    faults: Faults = field(default_factory=Faults)
    heartbeat_url: str | None = None  # a gateway to push heartbeats to (its base URL)
    heartbeat_interval_s: float = 1.0
    seed: int | None = None
    kv_link_gbps: float = KV_LINK_GBPS  # what a remote prefill's KV crosses to reach it
    scheduling_policy: str = "fcfs"  # or "priority": requests' `priority` orders the queue
