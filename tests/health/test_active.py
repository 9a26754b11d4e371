"""Active health checking: thresholds on probe results, and real probes of a real worker."""

from __future__ import annotations

import asyncio
import random

from fleetgate.clock import LoopClock
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.health import HealthFlag
from fleetgate.health.active import ActiveChecker, ActiveCheckSettings, ProbeTracker
from fleetgate.http.client import HttpClient
from fleetgate.workers.sim.spec import SimSpec
from fleetgate.workers.sim.worker import SimWorker

SETTINGS = ActiveCheckSettings(unhealthy_threshold=3, healthy_threshold=2, timeout_s=0.2)


def state(url: str = "http://127.0.0.1:9") -> BackendState:
    return BackendState(Backend("b", url, ("m",)))


def test_one_bad_probe_does_not_flip_a_backend_but_a_run_of_them_does() -> None:
    s = state()
    tracker = ProbeTracker(SETTINGS, s)
    for ok in (False, False, True, False, False):
        assert not tracker.record(ok, 0.0)
    assert s.healthy
    assert tracker.record(False, 0.0)  # the third failure in a row
    assert s.flags == HealthFlag.ACTIVE_CHECK_FAILED
    assert not tracker.record(True, 0.0)
    assert tracker.record(True, 0.0)  # two good ones in a row
    assert s.healthy


def test_a_probe_flag_leaves_the_other_detectors_flags_alone() -> None:
    s = state()
    s.flags = HealthFlag.EJECTED
    tracker = ProbeTracker(SETTINGS, s)
    for _ in range(3):
        tracker.record(False, 0.0)
    for _ in range(2):
        tracker.record(True, 0.0)
    assert s.flags == HealthFlag.EJECTED


async def test_probes_see_a_live_worker_a_hanging_one_and_a_dead_port() -> None:
    loop = asyncio.get_running_loop()
    sim = SimWorker(SimSpec(model="m", profile="h100-llama3-8b"), random.Random(1), loop)
    server = await sim.start("127.0.0.1", 0)
    client = HttpClient()
    checker = ActiveChecker(client, LoopClock(), random.Random(2))
    live = state(f"http://127.0.0.1:{server.port}")
    try:
        assert await checker.probe("m", live, SETTINGS)
        near = live.latency.rtt_s
        assert near is not None and near < 0.05
        sim.faults.faults.network_delay_s = 0.1  # now as far as another region
        assert await checker.probe("m", live, SETTINGS)
        far = live.latency.rtt_s  # (an average: the newest, at least 0.1 s, weighs 0.2)
        # Not near + 0.02: the first probe's round trip (a new connection, on a loaded
        # machine up to 10 ms) may be longer than the second's own share of it.
        assert far is not None and far >= 0.8 * near + 0.2 * 0.1
        sim.faults.faults.network_delay_s = 0.0
        inference = ActiveCheckSettings(kind="inference", timeout_s=2.0)
        assert await checker.probe("m", live, inference)
        assert not await checker.probe("other-model", live, inference)  # a 404
        sim.faults.faults.hang = True
        assert not await checker.probe("m", live, SETTINGS)  # times out
        server.abort()
        assert not await checker.probe("m", live, SETTINGS)  # refused
    finally:
        await client.close()
        server.abort()
        await sim.stop()
