"""Self-calibrating weights: shares follow the engines' fitted speed, throttling lowers them."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from fleetgate.bench.tracefile import azure_rows
from fleetgate.bench.traces import AZURE_CONV, open_trace
from fleetgate.config import PoolConfig, default_sim_config
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.calibration import FLOOR, WeightSettings, factor, speed_factors
from fleetgate.fleet.engine_load import StepTotals
from fleetgate.fleet.pool import Pool
from fleetgate.fleet.step_fit import Speed
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.registry import PluginContext, default_registry
from fleetgate.routing.router import Router
from tests.fleet.fleet_replay import Arrival, replay_pool

REQUEST = RoutingRequest("m", "chat", True)


def states(n: int) -> list[BackendState]:
    return [
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",))) for i in range(n)
    ]


def measured(state: BackendState, c: float, intervals: int = 12) -> None:
    """Scrapes of an engine (restarted) whose steps take 5 ms + c per token, of 100 to 1,200
    tokens."""
    totals = StepTotals(0, 0, 0, 0)
    state.step_fit.add(totals)
    for i in range(intervals):
        x = 100 + 100 * (i % 12)
        steps, gaps = 10, 80
        totals = StepTotals(
            totals.steps + steps, totals.tokens + steps * x,
            totals.gaps + gaps, totals.gap_s + gaps * (0.005 + c * x),
        )  # fmt: skip
        state.step_fit.add(totals)


def test_factors_are_speeds_relative_to_the_fastest_once_enough_intervals_are_seen() -> None:
    h100, a100, new, throttled = states(4)
    measured(h100, 1e-5)
    measured(a100, 2e-5)
    measured(new, 1e-5, intervals=3)  # too few to trust
    measured(throttled, 1e-3)
    factors = speed_factors([h100, a100, new, throttled], WeightSettings())
    assert factors == pytest.approx([1.0, 0.5, 1.0, FLOOR])
    assert speed_factors([h100, new], WeightSettings()) == [1.0, 1.0]  # one known: no scale


def test_a_speed_ratio_counts_only_beyond_one_standard_error_of_it() -> None:
    fastest = Speed(50_000.0, 0.05)
    # 4% slower, each known within 5%: what tells them apart may be noise alone.
    assert factor(Speed(48_000.0, 0.05), fastest) == 1.0
    # Half as fast: half the share, raised by one standard error of the ratio.
    half = factor(Speed(25_000.0, 0.05), fastest)
    assert half == pytest.approx(0.5 * math.exp(math.hypot(0.05, 0.05)))
    assert factor(Speed(25_000.0, 0.01), Speed(50_000.0, 0.01)) < half  # better known: lower
    assert factor(Speed(1_000.0, 0.01), fastest) == FLOOR


def router_of(backends: list[BackendState], **settings: object) -> Router:
    pool = Pool("m", backends, weights=WeightSettings(**settings))
    ctx = PluginContext(random.Random(0), pool.board)
    return Router(pool, default_registry().build_pipeline("least_requests", {}, ctx))


def routed(router: Router, now: float, n: int = 300) -> Counter[str]:
    pool = router.pool
    picks: Counter[str] = Counter()
    held = []
    for _ in range(n):
        state = router.pick(REQUEST, now)
        assert state is not None
        pool.begin(state.backend.id, now)
        held.append(state)
        picks[state.backend.id] += 1
    for state in held:
        pool.end(state.backend.id, now)
    return picks


def test_a_faster_backend_gets_more_after_calibration_and_a_throttled_one_less() -> None:
    fast, slow = states(2)
    router = router_of([fast, slow], calibrate=True, interval_s=10.0)
    measured(fast, 1e-5)
    measured(slow, 2e-5)
    assert routed(router, 1.0) == {"b0": 150, "b1": 150}  # before the first calibration
    shares = routed(router, 10.0)
    assert (fast.weight, slow.weight) == pytest.approx((1.0, 0.5))
    assert shares["b0"] == pytest.approx(200, abs=2)  # in flight per weight: 2 to 1
    measured(fast, 8e-5, intervals=60)  # thermal throttling: its steps take longer
    routed(router, 20.0, n=1)
    assert fast.weight < slow.weight == 1.0


def test_calibration_is_on_by_default_and_off_keeps_typed_weights() -> None:
    assert WeightSettings().calibrate
    fast, slow = states(2)
    router = router_of([fast, slow], calibrate=False)
    measured(fast, 1e-5)
    measured(slow, 2e-5)
    assert routed(router, 100.0) == {"b0": 150, "b1": 150}
    assert fast.weight == slow.weight == 1.0


# The short requests: E2E ~0.3 s on the built-in H100, ~0.8 s on its A100.
SHORT_ANSWER_TOKENS = 64


def first_requests(n: int, answer_tokens: int | None, pace: float = 1.0) -> list[Arrival]:
    """The first `n` requests of `fleetgate bench`'s default workload (the azure-conv trace's
    prompts, at its times sped up `pace` times), asking for `answer_tokens` (None: the
    trace's own answer lengths)."""
    with open_trace(AZURE_CONV) as f:
        rows = itertools.islice(azure_rows(f, AZURE_CONV), n)
        return [
            Arrival(r.at_s / pace, r.input_tokens, answer_tokens or r.output_tokens) for r in rows
        ]


def h100_and_a100(pool: PoolConfig) -> tuple[int, int]:
    accelerators = [b.labels["accelerator"] for b in pool.backends]
    return accelerators.index("H100"), accelerators.index("A100")


@pytest.mark.parametrize("seed", range(4))  # the scrapes' jitter and the router's draws
async def test_a_fresh_built_in_fleet_never_weights_its_h100_below_its_a100(seed: int) -> None:
    # Replayed in virtual time (tests/fleet/fleet_replay.py). Before speeds needed confidence,
    # the low-load fits' flat lines put the H100 at 0.31 of the A100 (seed 0), 0.10 (seed 3).
    pool = default_sim_config().pools[0]
    h100, a100 = h100_and_a100(pool)
    replay = await replay_pool(pool, first_requests(200, SHORT_ANSWER_TOKENS), seed)
    below = [
        f"request {r.request} at {r.at_s:.1f} s: H100 {r.weights[h100]:.2f}, "
        f"A100 {r.weights[a100]:.2f}"
        for r in replay.routed
        if r.weights[h100] < r.weights[a100]
    ]
    assert not below, "\n".join(below)


async def test_a_busier_built_in_fleet_learns_its_a100_is_slower_within_200_requests() -> None:
    # The same requests with their own answers at twice the pace: the engines run steps big
    # enough to fit, and the A100 comes out about half the H100's weight (2.7x slower in pure
    # compute; its line is still bent by light steps, and a ratio counts beyond its error).
    pool = default_sim_config().pools[0]
    h100, a100 = h100_and_a100(pool)
    replay = await replay_pool(pool, first_requests(200, None, pace=2.0), seed=0)
    assert all(r.weights[h100] >= r.weights[a100] for r in replay.routed)
    last = replay.routed[-1].weights
    assert last[h100] == 1.0 and 0.3 < last[a100] < 0.65
