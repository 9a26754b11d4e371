"""A simulation's scenario: the YAML file `fleetgate simulate --scenario` reads.

    name: mooncake-16
    seed: 0
    regions:
      - name: us-east
        zones: [a, b]                # the replicas are spread over them in turn
        gateways: 1                  # gateway instances in this region
        pools:
          - model: llama-3.1-8b      # a pool of the gateway config below
            profile: h100-llama3-8b  # the sim worker's engine profile
            replicas: 16
    latency_ms:                      # one way, from a region to another (default 0 within
      us-east: {eu-west: 40}         #   a region, `default_latency_ms` between two)
    workload:                        # any bench workload, or a trace file, scaled
      name: mooncake-conv
      speed: 1.0
      clients: {us-east: 1.0}        # where requests come from, by share
      tenants: {gold: 1.0}           # who sends them (the gateway config's tenants), by share
    gateway:                         # the config `fleetgate serve` takes; its pools'
      pools:                         #   backends are the replicas above
        - model: llama-3.1-8b
    slo: {ttft_ms: 2000, itl_ms: 200}  # what the report counts as goodput
    events:
      - {at_s: 600, kind: crash, region: us-east, replicas: 2}
      - {at_s: 900, kind: recover, region: us-east}

Events, each at `at_s` in a `region` (`zone`: only that zone's replicas there):
    crash      `replicas` of them (default all: a zone or region outage) die; their
               connections are reset, new ones refused
    recover    every crashed one there comes back, its cache cold
    slowdown   `replicas` of them (default all) step `factor` times slower (thermal
               throttling, a noisy neighbour); factor 1 restores them
    add        `replicas` new ones (of the region's first pool, or `model`'s) join the pool
               of every gateway, probed first, at the pool's slow start
    remove     `replicas` of them leave every gateway's pool, drained: no request is cut
    surge      the workload runs `factor` times faster for `duration_s` (all clients; no
               region needed)
    autoscale  `enabled: false` stops the autoscalers acting (they still recommend), true
               lets them act again

Autoscaling: a pool whose gateway config has `autoscale.enabled` is scaled by the gateways'
own autoscalers (autoscale/scaler.py); what acts is the simulator's actuator: replicas start in
the acting gateway's region, serving `startup_s` after they are asked for (pulling the image,
loading the weights), and the ones it drains leave every gateway's pool. With several
gateways the state must be shared (`state.url`): the holder of the pool's lease acts.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from fleetgate.bench.stats import Slo
from fleetgate.config import Config, ConfigError, parse_config
from fleetgate.settings import Settings
from fleetgate.simulate.engine import slowed
from fleetgate.simulate.workload import WorkloadSettings
from fleetgate.workers.sim.profiles import PROFILES, EngineProfile

MAX_REPLICAS = 100_000  # in a scenario, all regions and events together
MAX_GATEWAYS = 1_000
MAX_TIME_S = 1e6  # ~11.6 days: past 2^24 s the event loop's clock cannot tell timers apart


class PoolSpec(Settings, frozen=True):
    """Replicas of one pool in one region."""

    model: str
    profile: str = "h100-llama3-8b"
    replicas: int = 1
    gpus: int = 1  # GPUs per replica (for GPU-seconds): 4 for a TP4 70B
    # Every step takes this many times the profile's time, as `fleetgate worker sim
    # --slowdown` runs it (a live run on a small machine is dilated to keep up).
    slowdown: float = 1.0
    startup_s: float = 60.0  # an autoscaled replica's time from asked for to serving

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            known = ", ".join(sorted(PROFILES))
            raise ValueError(f"unknown engine profile {self.profile!r}; known: {known}")
        if self.replicas < 0:
            raise ValueError(f"`replicas` must be >= 0, got {self.replicas}")
        if self.gpus < 1:
            raise ValueError(f"`gpus` must be >= 1, got {self.gpus}")
        if not (self.startup_s >= 0 and math.isfinite(self.startup_s)):
            raise ValueError(f"`startup_s` must be a time >= 0, got {self.startup_s}")
        if not (self.slowdown > 0 and math.isfinite(self.slowdown)):
            raise ValueError(f"`slowdown` must be a number > 0, got {self.slowdown}")

    def engine_profile(self) -> EngineProfile:
        """The profile its engines run, slowed down as asked."""
        return slowed(PROFILES[self.profile], self.slowdown)


class RegionSpec(Settings, frozen=True):
    name: str
    zones: tuple[str, ...] = ("a",)
    gateways: int = 1
    pools: tuple[PoolSpec, ...] = ()

    def __post_init__(self) -> None:
        if not self.zones:
            raise ValueError(f"region {self.name!r} needs at least one zone")
        if self.gateways < 0:
            raise ValueError(f"`gateways` must be >= 0, got {self.gateways}")


class SloSpec(Settings, frozen=True):
    ttft_ms: float | None = None
    itl_ms: float | None = None

    def __post_init__(self) -> None:
        for name, value in (("ttft_ms", self.ttft_ms), ("itl_ms", self.itl_ms)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"slo.{name} must be a number of ms > 0, got {value}")

    def slo(self) -> Slo:
        return Slo(self.ttft_ms, self.itl_ms)


EventKind = Literal["crash", "recover", "slowdown", "add", "remove", "surge", "autoscale"]


class EventSpec(Settings, frozen=True):
    """One timed event (the module docstring says what each kind does)."""

    at_s: float
    kind: EventKind
    region: str = ""
    zone: str | None = None
    replicas: int | None = None  # how many (None: all there; add and remove need a count)
    model: str | None = None  # add: the pool (None: the region's first)
    factor: float = 1.0  # slowdown: step time multiplied; surge: the rate multiplied
    duration_s: float = 0.0  # surge: how long
    enabled: bool = True  # autoscale: whether the autoscalers act from now on

    def __post_init__(self) -> None:
        if not (self.at_s >= 0 and math.isfinite(self.at_s)):
            raise ValueError(f"an event's `at_s` must be a time >= 0, got {self.at_s}")
        if self.replicas is not None and self.replicas < 1:
            raise ValueError(f"an event's `replicas` must be >= 1, got {self.replicas}")
        if not (self.factor > 0 and math.isfinite(self.factor)):
            raise ValueError(f"an event's `factor` must be a number > 0, got {self.factor}")
        if self.kind in ("add", "remove") and self.replicas is None:
            raise ValueError(f"a `{self.kind}` event needs `replicas`: how many")
        if self.kind == "surge" and not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ValueError("a `surge` event needs `duration_s` > 0")
        if self.kind not in ("surge", "autoscale") and not self.region:
            raise ValueError(f"a `{self.kind}` event needs the `region` it happens in")


class Scenario(Settings, frozen=True):
    regions: tuple[RegionSpec, ...]
    name: str = "scenario"
    seed: int = 0
    latency_ms: dict[str, dict[str, float]] = msgspec.field(default_factory=dict)
    default_latency_ms: float = 0.0
    # With a `state.url` in the gateway config, the gateways share their routing state
    # through one Redis (simulated) in `state_region` (default: the first region), each
    # command taking the round trip there plus `state_rtt_ms`.
    state_region: str = ""
    state_rtt_ms: float = 0.5
    workload: WorkloadSettings = msgspec.field(default_factory=WorkloadSettings)
    gateway: dict[str, Any] = msgspec.field(default_factory=dict)
    slo: SloSpec = msgspec.field(default_factory=SloSpec)
    events: tuple[EventSpec, ...] = ()

    def __post_init__(self) -> None:
        names = [r.name for r in self.regions]
        if not names:
            raise ValueError("a scenario needs at least one region")
        if len(set(names)) != len(names):
            raise ValueError("region names must be unique")
        if not any(r.gateways for r in self.regions):
            raise ValueError("a scenario needs at least one gateway")
        if self.state_region and self.state_region not in names:
            raise ValueError(f"state_region: unknown region {self.state_region!r}")
        if not (self.state_rtt_ms >= 0 and math.isfinite(self.state_rtt_ms)):
            raise ValueError(f"state_rtt_ms must be >= 0, got {self.state_rtt_ms}")
        if not (self.default_latency_ms >= 0 and math.isfinite(self.default_latency_ms)):
            raise ValueError(f"default_latency_ms must be >= 0, got {self.default_latency_ms}")
        replicas = sum(p.replicas for r in self.regions for p in r.pools)
        replicas += sum(e.replicas or 0 for e in self.events if e.kind == "add")
        if replicas > MAX_REPLICAS:
            raise ValueError(f"at most {MAX_REPLICAS:,} replicas in all, not {replicas:,}")
        if sum(r.gateways for r in self.regions) > MAX_GATEWAYS:
            raise ValueError(f"at most {MAX_GATEWAYS:,} gateways in all")
        zones = {r.name: r.zones for r in self.regions}
        for event in self.events:
            if event.at_s > MAX_TIME_S or event.duration_s > MAX_TIME_S:
                raise ValueError(f"an event's times must be within {MAX_TIME_S:g} s")
            there = zones.get(event.region, ())
            if event.zone is not None and event.zone not in there:
                raise ValueError(f"an event's zone {event.zone!r} is not one of region "
                                 f"{event.region!r}'s: {', '.join(there)}")  # fmt: skip
        for where in [*self.workload.clients, *(e.region for e in self.events if e.region)]:
            if where not in names:
                raise ValueError(f"unknown region {where!r}; the scenario's: {', '.join(names)}")
        for origin, row in self.latency_ms.items():
            for target, ms in [(origin, 0.0), *row.items()]:
                if target not in names:
                    raise ValueError(f"latency_ms: unknown region {target!r}")
                if not (ms >= 0 and math.isfinite(ms)):
                    raise ValueError(f"latency_ms: {origin} -> {target} must be >= 0 ms")

    @property
    def redis_region(self) -> str:
        """Where the shared state's Redis is."""
        return self.state_region or self.regions[0].name

    def latency_s(self, origin: str, target: str) -> float:
        """One-way network latency from one region to another."""
        if origin == target:
            ms = self.latency_ms.get(origin, {}).get(target, 0.0)
        else:
            ms = self.latency_ms.get(origin, {}).get(
                target, self.latency_ms.get(target, {}).get(origin, self.default_latency_ms)
            )
        return ms / 1000.0


@dataclass(frozen=True, slots=True)
class Replica:
    """One simulated backend: where it is and what it serves."""

    url: str
    region: str
    zone: str
    pool: PoolSpec  # what it runs (a region may have several of one model: a mixed fleet)

    @property
    def model(self) -> str:
        return self.pool.model

    @property
    def gpus(self) -> int:
        return self.pool.gpus


def replica_url(model: str, n: int, region: str) -> str:
    """The `n`th replica of `model` in `region` (numbered over all its pools there)."""
    return f"http://{model}-{n}.{region}.sim:8000"


def replicas(scenario: Scenario) -> Iterator[Replica]:
    """Every replica of the scenario, each region's pools in order, zones taken in turn."""
    for region in scenario.regions:
        counts: dict[str, int] = {}
        for pool in region.pools:
            for i in range(pool.replicas):
                n = counts[pool.model] = counts.get(pool.model, -1) + 1
                zone = region.zones[i % len(region.zones)]
                yield Replica(replica_url(pool.model, n, region.name), region.name, zone, pool)


def gateway_config(scenario: Scenario, region: str) -> Config:
    """The scenario's gateway config for a gateway in `region`: its pools' backends are the
    replicas serving their model, wherever they are (ConfigError: it is wrong)."""
    fleet = list(replicas(scenario))
    data = dict(scenario.gateway)
    pools = []
    for pool in data.get("pools", []):
        backends = [
            {"url": r.url, "engine": "vllm", "labels": {"region": r.region, "zone": r.zone}}
            for r in fleet
            if r.model == pool.get("model")
        ]
        pools.append({**pool, "backends": backends})
    data["pools"] = pools
    server = dict(data.get("server", {}))
    server.setdefault("region", region)
    # Nobody scrapes a simulated gateway or watches its dashboard: their per-request counting
    # is off unless the config asks for it (a fifth of a run's time).
    server.setdefault("metrics", False)
    server.setdefault("dashboard", False)
    data["server"] = server
    return parse_config(data)


def parse_scenario(data: Any) -> Scenario:
    """A scenario from parsed YAML; ConfigError saying what and where when it is wrong."""
    try:
        scenario = msgspec.convert(data, Scenario)
    except msgspec.ValidationError as exc:
        raise ConfigError(str(exc).replace("Object contains", "Unknown key:")) from None
    config = gateway_config(scenario, scenario.regions[0].name)  # its errors now, not later
    gateways = sum(r.gateways for r in scenario.regions)
    scaled = [p.model for p in config.pools if p.autoscale.enabled]
    if scaled and gateways > 1 and config.state.url is None:
        raise ConfigError(f"pool {scaled[0]!r} is autoscaled by {gateways} gateways: give the "
                          "gateway config a `state.url` so that one of them acts")  # fmt: skip
    why = unsimulated(config)
    if why is not None:
        raise ConfigError(f"the simulator cannot run this gateway config: {why}")
    keyed = {t.name for t in config.tenants if t.keys}
    for tenant in scenario.workload.tenants:
        if tenant not in keyed:
            raise ConfigError(f"workload.tenants: {tenant!r} is no tenant with a key in the "
                              "gateway config")  # fmt: skip
    if config.auth_enabled and not scenario.workload.tenants:
        raise ConfigError("the gateway config asks callers for keys: say who sends the "
                          "workload in workload.tenants")  # fmt: skip
    models = {p.model for p in config.pools}
    for event in scenario.events:
        if event.model is not None and event.model not in models:
            raise ConfigError(f"an event adds replicas of {event.model!r}, which no pool serves")
    return scenario


def unsimulated(config: Config) -> str | None:
    """What of `config` the simulator does not model (it would run, but not as live), or
    None: said up front rather than left to a run that quietly differs."""
    if not config.pools:
        return "it has no pool: the workload goes to its first"
    for pool in config.pools:
        if pool.prefill is not None:
            return "disaggregated prefill is not simulated: leave `prefill` out"
        if pool.health_check.enabled and pool.health_check.kind == "heartbeat":
            return "simulated replicas send no heartbeats: use a health check of another kind"
        if any(b.kv_events is not None for b in pool.backends):
            return "engines' KV-event feeds are not simulated"
    if config.discovery:
        return "discovery is not simulated: the scenario's replicas are the backends"
    if config.limits.store == "redis" or (config.cache.enabled and config.cache.store == "redis"):
        return "the simulator shares routing state, not limits or the response cache: use memory"
    return None


def load_scenario(path: str | Path) -> Scenario:
    """A scenario file; ConfigError when it cannot be read or is wrong."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read scenario {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path} is not a YAML file: {exc}") from None
    return parse_scenario(data)
