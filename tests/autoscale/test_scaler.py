"""A pool's scaler (autoscale/scaler.py) over a real pool and membership, with an actuator
that records what it is asked (the actuators themselves are tested on their own): a
scale-down drains first and removes a replica only once nothing is in flight on it; a
scale-up takes drained replicas back before it starts new ones; among gateways sharing a
Redis, only the lease holder acts."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fleetgate.autoscale.recommender import AutoscaleSettings, Recommender
from fleetgate.autoscale.scaler import PoolNow, PoolScaler
from fleetgate.clock import LoopClock
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.membership import Joining, Membership
from fleetgate.fleet.pool import Pool
from fleetgate.shared.lease import Lease

MODEL = "m"
# Decides at once both ways, one replica a target of 2 requests.
SETTINGS = AutoscaleSettings(
    enabled=True, min_replicas=1, max_replicas=4, target_in_flight=2,
    scale_down_window_s=0, max_step_down=4,
)  # fmt: skip


class Recording:
    """An actuator that owns every backend and records what it was asked."""

    name = "recording"

    def __init__(self, members: Membership) -> None:
        self.members = members
        self.started = 0
        self.stopped: list[str] = []

    def owns(self, backend: str) -> bool:
        return True

    async def start(self, count: int, desired: int) -> int:
        for _ in range(count):
            port = 9000 + self.started
            self.members.add(MODEL, Joining(f"http://127.0.0.1:{port}"))
            self.started += 1
        return count

    async def stop(self, backends: list[str]) -> None:
        self.stopped += backends

    def close(self) -> None:
        pass


def setup(n: int, lease: Lease | None = None) -> tuple[Pool, PoolScaler, Recording]:
    states = [
        BackendState(Backend(f"127.0.0.1:{8000 + i}", f"http://127.0.0.1:{8000 + i}", (MODEL,)))
        for i in range(n)
    ]
    pool = Pool(MODEL, states)
    members = Membership({MODEL: pool}, lambda: 0.0)
    actuator = Recording(members)
    scaler = PoolScaler(
        lambda: PoolNow(pool, 0, None, 5.0), Recommender(SETTINGS), actuator, members,
        clocks=(lambda: 0.0, lambda: 0.0), model=MODEL, lease=lease,
    )  # fmt: skip
    return pool, scaler, actuator


def load(pool: Pool, backend: str, requests: int) -> None:
    for _ in range(requests):
        pool.board.begin(backend, 10)


async def test_a_scale_down_drains_and_removes_only_what_has_nothing_in_flight() -> None:
    pool, scaler, actuator = setup(3)
    load(pool, "127.0.0.1:8001", 1)  # 1 in flight: 1 replica is enough
    await scaler.tick()
    status = scaler.status
    assert status is not None and (status.replicas, status.desired) == (1, 1)
    # The two least loaded drained, and with nothing in flight on them, removed from the
    # pool and stopped at once; the one with a request keeps serving.
    assert status.draining == []
    assert actuator.stopped == ["127.0.0.1:8000", "127.0.0.1:8002"]
    assert [s.backend.id for s in pool.states] == ["127.0.0.1:8001"]


async def test_a_drained_replica_with_a_request_in_flight_waits_for_it() -> None:
    pool, scaler, actuator = setup(2)
    load(pool, "127.0.0.1:8000", 1)
    load(pool, "127.0.0.1:8001", 1)
    await scaler.tick()  # 2 in flight: 2 -> 1, the first drains with its request
    draining = scaler.status.draining if scaler.status else []
    assert draining == ["127.0.0.1:8000"]
    await scaler.tick()
    assert actuator.stopped == [] and draining[0] in pool.members
    pool.board.end(draining[0], 10, 0)
    await scaler.tick()
    assert actuator.stopped == draining and draining[0] not in pool.members


async def test_a_scale_up_takes_drained_replicas_back_before_starting_new_ones() -> None:
    pool, scaler, actuator = setup(3)
    for backend in ("127.0.0.1:8000", "127.0.0.1:8001", "127.0.0.1:8002"):
        load(pool, backend, 1)
    await scaler.tick()  # 3 in flight, 2 wanted: one drains, busy with its request
    assert scaler.status is not None and scaler.status.draining == ["127.0.0.1:8000"]
    load(pool, "127.0.0.1:8001", 5)  # 8 in flight: 4 wanted
    await scaler.tick()
    assert not any(s.flags & HealthFlag.DRAINING for s in pool.states)  # taken back
    assert actuator.started == 1 and len(pool.states) == 4 and actuator.stopped == []


async def test_among_gateways_sharing_a_redis_only_the_lease_holder_acts(client: Any) -> None:
    key = "test:lease:autoscale:m"
    clock = LoopClock()
    scalers = []
    for holder in ("gw-a", "gw-b"):
        lease = Lease(client.execute_command, key, holder, clock, ttl_s=2.0)
        pool, scaler, actuator = setup(1, lease)
        load(pool, "127.0.0.1:8000", 6)  # 3 replicas wanted
        scalers.append((scaler, actuator))
    for scaler, _ in scalers:
        await scaler.tick()
    assert [a.started for _, a in scalers] == [2, 0]
    assert [s.status.acting for s, _ in scalers if s.status] == [True, False]
    assert [s.status.desired for s, _ in scalers if s.status] == [3, 3]  # both show it


async def test_the_load_signals_are_averaged_over_the_smoothing_time() -> None:
    states = [BackendState(Backend("127.0.0.1:8000", "http://127.0.0.1:8000", (MODEL,)))]
    pool = Pool(MODEL, states)
    members = Membership({MODEL: pool}, lambda: 0.0)
    now = [0.0]
    scaler = PoolScaler(
        lambda: PoolNow(pool, 0, None, 5.0), Recommender(SETTINGS), None, members,
        clocks=(lambda: now[0], lambda: now[0]), model=MODEL, smoothing_s=10.0,
    )  # fmt: skip
    load(pool, "127.0.0.1:8000", 8)
    await scaler.tick()
    assert scaler.status is not None and scaler.status.signals.in_flight == 8  # the first
    for _ in range(8):
        pool.board.end("127.0.0.1:8000", 10, 0)
    now[0] = 10.0
    await scaler.tick()
    assert scaler.status.signals.in_flight == pytest.approx(8 * math.exp(-1))
    assert scaler.status.raw == 2  # ceil(2.94 / 2), not 0: one quiet reading is not a trend


async def test_an_actuator_that_fails_does_not_end_the_scalers_loop() -> None:
    pool, scaler, actuator = setup(1)

    async def broken(count: int, desired: int) -> int:
        raise OSError("no such program")

    actuator.start = broken  # type: ignore[method-assign]
    load(pool, "127.0.0.1:8000", 6)
    await scaler.tick()  # logged, not raised
    assert scaler.status is not None and scaler.status.desired == 3
    await scaler.tick()  # and the next tick runs as well
