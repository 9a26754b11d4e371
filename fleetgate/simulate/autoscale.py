"""The autoscaler's actuator in a simulation (autoscale/scaler.py's `Actuator`), acting as a
Kubernetes workload's does: asked for replicas, it asks for them in its gateway's region and
returns at once; they serve `startup_s` later (simulate/changes.py). Replicas asked for and not
up yet count, whoever asked: a scaler, or another gateway's that held the lease before, never
asks for them twice. It stops the ones the scaler drained, in every gateway's pool, and owns the
replicas of its pool in its region: the scaler may drain any of them."""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.simulate.changes import FleetChanges


class SimActuator:
    name = "simulated"

    def __init__(self, changes: FleetChanges, region: str, model: str,
                 startup_s: float) -> None:  # fmt: skip
        self._changes = changes
        self._region = region
        self._model = model
        self._startup_s = startup_s

    def owns(self, backend: str) -> bool:
        """Autoscaling off: none (nothing is drained either)."""
        return self._changes.autoscaling and backend in self._changes.of(self._region, self._model)

    async def start(self, count: int, desired: int) -> int:
        if not self._changes.autoscaling:
            return 0
        needed = count - self._changes.starting(self._model)
        if needed <= 0:
            return 0
        self._changes.add_later(self._region, self._model, needed, self._startup_s)
        return needed

    async def stop(self, backends: Sequence[str]) -> None:
        mine = self._changes.of(self._region, self._model)
        self._changes.retire([mine[b] for b in backends if b in mine])

    def close(self) -> None:
        pass  # the fleet outlives a gateway's scaler
