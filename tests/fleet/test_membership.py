"""Pool members added and removed at run time (fleet/membership.py, health/probes.py): a new
backend is probed and scraped as the configured ones are (a real sim worker, a dead port), and
a removed one no more once it has left."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from fleetgate.clock import LoopClock
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.membership import AlreadyMember, Joining, Membership, NotMember
from fleetgate.fleet.pool import Pool
from fleetgate.fleet.scraper import MetricsScraper, ScrapeSettings
from fleetgate.health.active import ActiveChecker, ActiveCheckSettings
from fleetgate.health.probes import BackendProbes
from fleetgate.http.client import HttpClient
from fleetgate.workers.sim.spec import SimSpec
from fleetgate.workers.sim.worker import SimWorker

CHECKS = ActiveCheckSettings(interval_s=0.01, timeout_s=0.2, unhealthy_threshold=1)
SCRAPES = ScrapeSettings(interval_s=0.01)
ROUNDS_S = 0.2  # twenty intervals of probes and scrapes


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "never happened"
        await asyncio.sleep(0.01)


def test_a_backend_joins_a_pool_under_a_new_name_once_and_only_a_pool_that_exists() -> None:
    first = BackendState(Backend("127.0.0.1:8100", "http://127.0.0.1:8100", ("m",), name="m#0"))
    pool = Pool("m", [first])
    members = Membership({"m": pool}, lambda: 0.0)
    added = members.add("m", Joining("http://127.0.0.1:8101/v1", 2.0, {"zone": "b"}))
    backend = added.backend
    assert (backend.id, backend.name, backend.weight, dict(backend.labels)) == (
        "127.0.0.1:8101", "m#1", 2.0, {"zone": "b"}
    )  # fmt: skip
    assert pool.states == (first, added) and added in pool.candidates
    with pytest.raises(AlreadyMember, match=r"127\.0\.0\.1:8101"):
        members.add("m", Joining("http://127.0.0.1:8101"))
    with pytest.raises(NotMember, match="pools: m"):
        members.add("other", Joining("http://127.0.0.1:8102"))
    assert members.remove("127.0.0.1:8101") == [(pool, added)]
    assert pool.states == (first,)
    assert members.add("m", Joining("http://127.0.0.1:8101")).backend.name == "m#2"
    with pytest.raises(NotMember):
        members.remove("127.0.0.1:9999")
    assert members.set_weight("127.0.0.1:8100", 3.0) == [(pool, first)]
    assert (first.backend.weight, first.weight) == (3.0, 3.0)


async def test_a_new_backend_is_probed_and_scraped_until_it_has_left() -> None:
    loop = asyncio.get_running_loop()
    sim = SimWorker(SimSpec(model="m", profile="h100-llama3-8b"), random.Random(1), loop)
    server = await sim.start("127.0.0.1", 0)
    client = HttpClient()
    clock = LoopClock()
    checker = ActiveChecker(client, clock, random.Random(2))
    scraper = MetricsScraper(client, clock, random.Random(3))
    pool = Pool("m", [])
    probes = BackendProbes(checker, scraper)
    probes.start(pool, CHECKS, SCRAPES)
    members = Membership({"m": pool}, clock.now, probes)
    try:
        live = members.add("m", Joining(f"http://127.0.0.1:{server.port}"))
        dead = members.add("m", Joining("http://127.0.0.1:9"))  # nothing listens there
        await until(lambda: live.engine is not None)
        await until(lambda: dead.flags == HealthFlag.ACTIVE_CHECK_FAILED)
        assert pool.candidates == (live,)
        assert live.healthy
        pool.begin(live.backend.id, loop.time())  # a request in flight: it stays, and is watched
        members.remove(live.backend.id)
        members.remove(dead.backend.id)
        assert pool.states == (live,) and live.flags == HealthFlag.GONE
        reading = live.engine
        await until(lambda: live.engine is not reading)
        pool.end(
            live.backend.id, loop.time()
        )  # its last request: it leaves, nothing watches it now
        assert pool.states == ()
        dead.flags = HealthFlag(0)
        reading = live.engine
        await asyncio.sleep(ROUNDS_S)  # no event marks an absence: twenty intervals of none
        assert live.engine is reading and dead.flags == HealthFlag(0)
    finally:
        checker.stop()
        scraper.stop()
        await client.close()
        server.abort()
        await sim.stop()


def in_region(port: int, region: str) -> BackendState:
    url = f"http://127.0.0.1:{port}"
    return BackendState(Backend(f"127.0.0.1:{port}", url, ("m",), labels={"region": region}))


def test_a_drained_region_has_a_flag_of_its_own_and_reaches_every_pool_and_newcomer() -> None:
    eu, us, alone = in_region(8100, "eu"), in_region(8101, "us"), in_region(8102, "eu")
    prefill_eu = in_region(8110, "eu")
    alone.flags |= HealthFlag.DRAINING  # drained by itself (the operator, or not ready)
    pool, prefill = Pool("m", [eu, us, alone]), Pool("m", [prefill_eu])
    members = Membership({"m": pool}, lambda: 0.0, others=[prefill])
    members.drain_region("eu", True)
    assert eu.flags == HealthFlag.REGION_DRAINED and not us.flags
    assert prefill_eu.flags == HealthFlag.REGION_DRAINED  # a prefill pool's too
    assert pool.candidates == (us,)
    joined = members.add("m", Joining("http://127.0.0.1:8103", labels={"region": "eu"}))
    assert joined.flags == HealthFlag.REGION_DRAINED  # one that joins the region drains

    later = Pool("m", [in_region(8120, "eu")])  # a reload's new pool
    members.adopt({"m": later}, [prefill])
    assert later.states[0].flags == HealthFlag.REGION_DRAINED

    members.adopt({"m": pool}, [prefill])
    members.drain_region("eu", False)
    assert not eu.flags and not prefill_eu.flags and not joined.flags
    assert alone.flags == HealthFlag.DRAINING  # its own drain outlasts the drill
