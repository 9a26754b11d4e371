"""What counting a request's limits costs with each store: reserve on arrival and settle at the
end (traffic/limits.py) for a tenant with a requests and a tokens limit, in memory and in a
local Redis (a redis-server this script starts and stops), alternately in one process, printed
as a ratio.

    .venv/bin/python benchmarks/limit_store.py [--requests 5000] [--rounds 3] [--concurrency 64]

One at a time, the Redis figure is a round trip per take and per give (two per request); with
`--concurrency` requests in flight, it is what a busy gateway pays per request, round trips
overlapping.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import uvloop
from harness import redis_server

from fleetgate.clock import LoopClock
from fleetgate.traffic.instances import InstanceCount
from fleetgate.traffic.limits import Limits, Reservation
from fleetgate.traffic.redis_store import RedisStore, redis_client
from fleetgate.traffic.store import LimitStore, MemoryStore
from fleetgate.traffic.tenants import RateLimitSettings, Tenant, TenantSettings

TENANT = Tenant.of(
    TenantSettings(
        name="acme",
        limits=RateLimitSettings(requests_per_minute=1e12, tokens_per_minute=1e15),
    )
)


async def per_request_us(limits: Limits, n: int, concurrency: int) -> float:
    """Reserve, then settle with fewer tokens than reserved (a give), `n` times."""

    async def one() -> None:
        held = await limits.reserve(TENANT, "", 20, 100)
        assert isinstance(held, Reservation)
        await limits.settle(held, 20, 40)

    async def worker(count: int) -> None:
        for _ in range(count):
            await one()

    started = time.perf_counter()
    await asyncio.gather(*(worker(n // concurrency) for _ in range(concurrency)))
    return (time.perf_counter() - started) / (n // concurrency * concurrency) * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    with redis_server() as redis:
        client = redis_client(redis.url)
        instances = InstanceCount(client, "bench", "me", random.Random(0), LoopClock())
        stores: dict[str, LimitStore] = {
            "memory": MemoryStore(time.monotonic),
            "redis": RedisStore(client, instances, time.monotonic),
        }
        for concurrency in (1, args.concurrency):
            times: dict[str, list[float]] = {name: [] for name in stores}
            for store in stores.values():  # warm up: connections, script cache
                await per_request_us(Limits(store, time.time), 500, concurrency)
            for _ in range(args.rounds):
                for name, store in stores.items():
                    limits = Limits(store, time.time)
                    times[name].append(await per_request_us(limits, args.requests, concurrency))
            medians = {name: statistics.median(t) for name, t in times.items()}
            print(f"{concurrency} in flight:")
            for name, median in medians.items():
                each = ", ".join(f"{x:.1f}" for x in times[name])
                print(f"  {name:6}: {median:8.1f} us per reserve+settle   (rounds: {each})")
            ratio = medians["redis"] / medians["memory"]
            print(
                f"  redis / memory: {ratio:.0f}x (+{medians['redis'] - medians['memory']:.1f} us)"
            )
        store = stores["redis"]
        assert isinstance(store, RedisStore) and store.shared, "Redis failed during the run"
        await store.close()


if __name__ == "__main__":
    uvloop.run(main())
