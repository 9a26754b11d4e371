"""The simulated fleet as it changes during a run: its replicas, which are up, which left, and
what the scenario's events do to them (scenario.py lists the kinds). Replicas added join every
gateway's pool as discovery makes backends join (fleet/membership.py: probed first, at the
pool's slow start); replicas removed are retired from every gateway's pool (drained: what they
have in flight finishes). Keeps each region's replicas and GPUs up over time."""

from __future__ import annotations

import asyncio

from fleetgate.fleet.backend import REGION, ZONE, backend_id
from fleetgate.fleet.membership import Joining, Membership, NotMember
from fleetgate.http.client import Origin
from fleetgate.simulate.replica import SimBackend
from fleetgate.simulate.scenario import (
    EventSpec,
    PoolSpec,
    Replica,
    Scenario,
    replica_url,
    replicas,
)
from fleetgate.simulate.workload import BLOCK_TOKENS


class FleetChanges:
    """The replicas of a run, by origin (the dict the transport and scrapers read)."""

    def __init__(self, scenario: Scenario, loop: asyncio.AbstractEventLoop) -> None:
        self.scenario = scenario
        self._loop = loop
        self._pools: dict[tuple[str, str], PoolSpec] = {}  # each region's first pool of a model
        for region in scenario.regions:
            for pool in region.pools:
                self._pools.setdefault((region.name, pool.model), pool)
        self.replicas: list[Replica] = []
        self.backends: dict[Origin, SimBackend] = {}
        self._by_url: dict[str, SimBackend] = {}
        self._gone: set[str] = set()  # removed replicas' URLs
        self._staying: dict[tuple[str, str], dict[str, Replica]] = {}  # those not removed
        self.members: list[Membership] = []  # each gateway's (it adds them itself)
        self.autoscaling = True  # whether the autoscalers' actuators act (`autoscale` events)
        self._starting: dict[str, int] = {}  # replicas asked for and not up yet, by model
        # GPUs paid for while replicas start: (from, until, region, GPUs), for GPU-hours
        self.booting: list[tuple[float, float, str, int]] = []
        self.capacity: list[tuple[float, str, int, int]] = []  # time, region, replicas, GPUs
        for replica in replicas(scenario):
            self._place(replica)
        for region in scenario.regions:
            self._note(region.name)

    def apply(self, event: EventSpec) -> None:
        """`event` happens now (a surge is the workload's: simulate/warp.py)."""
        if event.kind == "add":
            region = next(r for r in self.scenario.regions if r.name == event.region)
            model = event.model or (region.pools[0].model if region.pools else "")
            self.add(region.name, model, event.replicas or 0, event.zone)
        elif event.kind == "remove":
            present = self._present(event)
            self.retire(present[max(0, len(present) - (event.replicas or 0)) :])  # newest first
        elif event.kind == "autoscale":
            self.autoscaling = event.enabled
        elif event.kind != "surge":
            hit = self._present(event)
            if event.kind == "recover":
                for replica in hit:
                    self._by_url[replica.url].restart()
            else:
                up = [r for r in hit if self._by_url[r.url].up]
                for replica in up[: event.replicas]:
                    backend = self._by_url[replica.url]
                    if event.kind == "crash":
                        backend.crash()
                    else:
                        backend.slow_down(event.factor)
        if event.region and event.kind not in ("add", "remove"):
            self._note(event.region)

    def _present(self, event: EventSpec) -> list[Replica]:
        """The replicas of the event's region (and zone) that have not left."""
        return [
            r for r in self.replicas
            if r.region == event.region and event.zone in (None, r.zone) and r.url not in self._gone
        ]  # fmt: skip

    def add(self, region: str, model: str, count: int, zone: str | None = None) -> None:
        """`count` new replicas of `model` in `region` join every gateway's pool."""
        spec = self._pools.get((region, model))  # the first pool of it there
        if spec is None:
            spec = self._pools[region, model] = PoolSpec(model=model)
        zones = next(r.zones for r in self.scenario.regions if r.name == region)
        for _ in range(count):
            n = sum(1 for r in self.replicas if r.region == region and r.model == model)
            where = zone or zones[n % len(zones)]
            url = replica_url(model, n, region)
            self._place(Replica(url, region, where, spec))
            joining = Joining(url, labels={REGION: region, ZONE: where}, engine="vllm")
            for members in self.members:
                members.add(model, joining, probe_first=True)
        self._note(region)

    def add_later(self, region: str, model: str, count: int, after_s: float) -> None:
        """`count` replicas asked for now, that `add` brings in `after_s` from now."""
        self._starting[model] = self.starting(model) + count
        self._loop.call_later(after_s, self._started, region, model, count)
        spec = self._pools.get((region, model)) or PoolSpec(model=model)
        now = self._loop.time()
        self.booting.append((now, now + after_s, region, count * spec.gpus))

    def starting(self, model: str) -> int:
        """Replicas of `model` asked for (`add_later`) and not up yet."""
        return self._starting.get(model, 0)

    def _started(self, region: str, model: str, count: int) -> None:
        self._starting[model] -= count
        self.add(region, model, count)

    def retire(self, leaving: list[Replica]) -> None:
        """These replicas leave every gateway's pool (drained: what they have finishes)."""
        for replica in leaving:
            self._gone.add(replica.url)
            self._staying[replica.region, replica.model].pop(backend_id(replica.url), None)
            for members in self.members:
                try:
                    members.remove(backend_id(replica.url), replica.model)
                except NotMember:  # a pool that never had it, or that let it go already
                    continue
        for region in {r.region for r in leaving}:
            self._note(region)

    def of(self, region: str, model: str) -> dict[str, Replica]:
        """The replicas of `model` in `region` that have not left, by backend id (kept as
        they come and go: the scaler asks once a member)."""
        return self._staying.get((region, model), {})

    def _place(self, replica: Replica) -> None:
        profile = replica.pool.engine_profile()
        backend = SimBackend(profile, self._loop, BLOCK_TOKENS, replica.region)
        self.replicas.append(replica)
        present = self._staying.setdefault((replica.region, replica.model), {})
        present[backend_id(replica.url)] = replica
        self.backends[Origin.parse(replica.url)] = backend
        self._by_url[replica.url] = backend

    def _note(self, region: str) -> None:
        up = [
            r for r in self.replicas
            if r.region == region and r.url not in self._gone and self._by_url[r.url].up
        ]  # fmt: skip
        self.capacity.append((self._loop.time(), region, len(up), sum(r.gpus for r in up)))

    def prefix_hit_rate(self) -> float:
        """The fleet's prefix-cache hit rate so far (engines restarted count from then)."""
        loads = [b.engine.load(self._loop.time()) for b in self.backends.values()]
        queries = sum(load.prefix_queries for load in loads)
        return sum(load.prefix_hits for load in loads) / queries if queries else 0.0
