"""The autoscaler's actuator in a simulation (autoscale/scaler.py's `Actuator`): it starts
replicas in its gateway's region, serving `startup_s` after they are asked for, and stops the
ones the scaler drained, in every gateway's pool (simulate/changes.py). It owns the replicas
of its pool in its region: the scaler may drain any of them, as a Kubernetes workload's."""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.clock import Clock
from fleetgate.simulate.changes import FleetChanges


class SimActuator:
    name = "simulated"

    def __init__(self, changes: FleetChanges, region: str, model: str, clock: Clock,
                 startup_s: float) -> None:  # fmt: skip
        self._changes = changes
        self._region = region
        self._model = model
        self._clock = clock
        self._startup_s = startup_s

    def owns(self, backend: str) -> bool:
        """Autoscaling off: none (nothing is drained either)."""
        return self._changes.autoscaling and backend in self._changes.of(self._region, self._model)

    async def start(self, count: int, desired: int) -> int:
        if not self._changes.autoscaling:
            return 0
        await self._clock.sleep(self._startup_s)
        self._changes.add(self._region, self._model, count)
        return count

    async def stop(self, backends: Sequence[str]) -> None:
        mine = self._changes.of(self._region, self._model)
        self._changes.retire([mine[b] for b in backends if b in mine])

    def close(self) -> None:
        pass  # the fleet outlives a gateway's scaler
