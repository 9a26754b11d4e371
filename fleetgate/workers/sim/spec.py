"""What one simulated worker is: the model it serves, its engine profile, its port, faults."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetgate.kv_events.wire import Encoding
from fleetgate.workers.sim.faults import Faults
from fleetgate.workers.sim.profiles import KV_LINK_GBPS


@dataclass(frozen=True, slots=True)
class KvEventsSpec:
    """Where and how a sim worker publishes its KV-cache events (kv_publisher.py)."""

    port: int = 0  # the PUB socket's; 0: any free port
    replay_port: int = 0  # the ROUTER replay socket's; 0: any free port
    encoding: Encoding = "map"  # "map": vLLM since June 2026, SGLang; "array": vLLM before
    topic: str = "kv-events"
    buffer: int = 10_000  # batches kept for replay


@dataclass(frozen=True, slots=True)
class RegisterSpec:
    """The Redis registry a sim worker registers in (discovery/registry.py)."""

    url: str  # redis://[:password@]host[:port][/db]
    prefix: str = "fleetgate"
    interval_s: float = 1.0  # between two heartbeats; the entry lapses after 3 missed


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
    kv_events: KvEventsSpec | None = None  # publish KV-cache events; None: no publisher
    num_gpu_blocks: int | None = None  # the profile's KV capacity replaced (vLLM's override)
    register: RegisterSpec | None = None  # keep an entry in a Redis registry while serving
