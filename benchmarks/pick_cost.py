"""What one routing decision costs, per policy, in pools of 8, 128 and 1,024 backends.

    .venv/bin/python benchmarks/pick_cost.py [--picks 20000]

Each pick is what a request costs routing: `router.pick`, then `pool.begin` and, once the
request is done, `pool.end` (which keep the pickers' indexes current). Requests carry a 2 KB
prompt from one of 64 shared system prompts (every eighth a 12 KB one, long enough for
`long_to_fast`) and a session key from 1,000, so prefix, length and session policies do their
real work; half the backends weigh 0.4 (A100s beside H100s), and engine readings are set on
every backend. The reference in the same run is each policy's own cost at 8 backends: the
ratio at 1,024 must stay within log2(1024) / log2(8) = 3.3 for an O(log n) pick (an O(n) one
would be 128).
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections import deque

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.engine_load import EngineLoad
from fleetgate.fleet.pool import Pool
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.registry import PluginContext, default_registry
from fleetgate.routing.router import Router

SIZES = (8, 128, 1024)
IN_FLIGHT = 4  # requests in flight per backend, on average


def requests(rng: random.Random, count: int) -> list[RoutingRequest]:
    systems = [f"system prompt {g} ".encode() * 100 for g in range(64)]
    out = []
    for i in range(count):
        prompt = systems[rng.randrange(64)] * (6 if i % 8 == 0 else 1) + f"question {i}".encode()
        out.append(RoutingRequest("m", "chat", True, 128, f"user-{rng.randrange(1000)}", prompt))
    return out


def router_of(policy: str, n: int, seed: int) -> Router:
    states = []
    rng = random.Random(seed)
    for i in range(n):
        state = BackendState(Backend(f"10.0.{i // 250}.{i % 250}:8000", "http://h:1", ("m",)))
        state.weight = 0.4 if i % 2 else 1.0
        state.engine = EngineLoad(rng.randrange(8), rng.randrange(3), rng.random(), 0, 0, None, 0)
        states.append(state)
    pool = Pool("m", states)
    ctx = PluginContext(random.Random(seed), pool.board, stale_after_s=math.inf)
    return Router(pool, default_registry().build_pipeline(policy, {}, ctx))


def cost_us(policy: str, n: int, picks: int) -> float:
    """Mean microseconds per pick + begin + end, in steady state."""
    router = router_of(policy, n, seed=n)
    pool = router.pool
    reqs = requests(random.Random(1), 2048)
    live: deque[BackendState] = deque()
    depth = IN_FLIGHT * n

    def run(count: int) -> None:
        for i in range(count):
            state = router.pick(reqs[i % len(reqs)], 1.0)
            assert state is not None
            pool.begin(state.backend.id, 1.0)
            live.append(state)
            if len(live) > depth:
                pool.end(live.popleft().backend.id, 1.0)

    run(depth + 2048)  # warm: queues full, indexes built, prefixes seen
    start = time.perf_counter()
    run(picks)
    return (time.perf_counter() - start) / picks * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--picks", type=int, default=20_000)
    args = parser.parse_args()
    bound = math.log2(SIZES[-1]) / math.log2(SIZES[0])
    print(
        f"{'policy':<22}" + "".join(f"{f'{n} (us)':>12}" for n in SIZES) + f"{'ratio':>9}  O(log n)"
    )
    worst = 0.0
    for policy in default_registry().policy_names:
        costs = [cost_us(policy, n, args.picks) for n in SIZES]
        ratio = costs[-1] / costs[0]
        worst = max(worst, ratio)
        row = "".join(f"{c:>12.2f}" for c in costs)
        print(f"{policy:<22}{row}{ratio:>9.2f}  {'yes' if ratio <= bound else 'NO'}")
    print(f"ratio = cost at {SIZES[-1]} / cost at {SIZES[0]}; O(log n) allows <= {bound:.1f}")
    return 0 if worst <= bound else 1


if __name__ == "__main__":
    raise SystemExit(main())
