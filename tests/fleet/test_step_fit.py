"""Fitting an engine's speed from its step metrics: the slope of step time against step size."""

from __future__ import annotations

import random

import pytest

from fleetgate.fleet.calibration import WeightSettings
from fleetgate.fleet.engine_load import StepTotals
from fleetgate.fleet.step_fit import Speed, StepFit

MAX_ERROR = WeightSettings().max_error


class Engine:
    """Running totals of a GPU whose steps take a + c * tokens, with decoding in every step."""

    def __init__(self, a: float, c: float, rng: random.Random) -> None:
        self.a, self.c, self.rng = a, c, rng
        self.totals = StepTotals(0.0, 0.0, 0.0, 0.0)

    def run(
        self, steps: int, tokens_per_step: float, batch: int = 8, noise: float = 0.03
    ) -> StepTotals:
        step_s = (self.a + self.c * tokens_per_step) * self.rng.uniform(1 - noise, 1 + noise)
        t = self.totals
        self.totals = StepTotals(
            t.steps + steps, t.tokens + steps * tokens_per_step,
            t.gaps + steps * batch, t.gap_s + steps * batch * step_s,
        )  # fmt: skip
        return self.totals


def feed(fit: StepFit, engine: Engine, intervals: int, rng: random.Random) -> None:
    for _ in range(intervals):
        fit.add(engine.run(rng.randint(5, 40), rng.uniform(40, 1500)))


@pytest.mark.parametrize("c", [26e-6, 70e-6])
def test_the_slope_is_found_whatever_the_load(c: float) -> None:
    rng = random.Random(1)
    fit, engine = StepFit(), Engine(0.008, c, rng)
    fit.add(engine.totals)
    feed(fit, engine, 30, rng)
    speed = fit.speed(10, MAX_ERROR)
    assert speed is not None
    assert speed.tokens_per_s == pytest.approx(1 / c, rel=0.1)
    assert speed.error < 0.05  # 3% noise on 30 well spread points


def test_no_speed_before_enough_intervals_nor_without_spread_in_step_size() -> None:
    rng = random.Random(2)
    fit, engine = StepFit(), Engine(0.008, 30e-6, rng)
    fit.add(engine.totals)
    feed(fit, engine, 9, rng)
    assert fit.speed(10, MAX_ERROR) is None
    steady = StepFit()
    for _ in range(30):  # always 64 tokens a step: the slope cannot be told from the fixed cost
        steady.add(engine.run(20, 64))
    assert steady.speed(10, MAX_ERROR) is None


def test_idle_intervals_and_a_restart_add_no_point() -> None:
    rng = random.Random(3)
    fit, engine = StepFit(), Engine(0.008, 30e-6, rng)
    fit.add(engine.totals)
    fit.add(engine.totals)  # nothing ran
    fit.add(StepTotals(0.0, 0.0, 0.0, 0.0))  # the engine restarted
    assert fit.points == 0
    fit.add(engine.run(10, 500))
    assert fit.points == 1


def test_a_throttled_engine_is_seen_slower_within_a_few_dozen_intervals() -> None:
    rng = random.Random(4)
    fit, engine = StepFit(), Engine(0.008, 30e-6, rng)
    fit.add(engine.totals)
    feed(fit, engine, 30, rng)
    before = fit.speed(10, MAX_ERROR)
    assert before is not None
    engine.a, engine.c = engine.a * 2, engine.c * 2  # every step twice as long
    feed(fit, engine, 40, rng)
    after = fit.speed(10, MAX_ERROR)
    assert after is not None and after.tokens_per_s < 0.6 * before.tokens_per_s


def test_a_flat_line_is_no_speed_however_many_points() -> None:
    # An engine at low load: its x spreads with prompts prefilled while nothing else decoded,
    # steps no inter-token gap timed, so y stays at the weights-bound decode step's time (here
    # rising 50 ns a token, with attention). The slope is positive and its points consistent,
    # but 1 / 50 ns (20M tokens/s, the speed trusted before) is no engine's.
    rng = random.Random(5)
    fit, engine = StepFit(), Engine(0.0046, 50e-9, rng)
    fit.add(engine.totals)
    for _ in range(60):
        fit.add(engine.run(rng.randint(20, 150), rng.uniform(1, 80), noise=0.0005))
    assert fit.speed(10, MAX_ERROR) is None


def test_a_noisy_slope_is_trusted_only_once_its_standard_error_is_small() -> None:
    rng = random.Random(6)
    fit, engine = StepFit(), Engine(0.008, 30e-6, rng)
    fit.add(engine.totals)
    for _ in range(10):  # a few points, each up to 60% off the line
        fit.add(engine.run(rng.randint(5, 40), rng.uniform(40, 400), noise=0.6))
    assert fit.speed(10, MAX_ERROR) is None
    for _ in range(50):
        fit.add(engine.run(rng.randint(5, 40), rng.uniform(40, 1500), noise=0.1))
    speed = fit.speed(10, MAX_ERROR)
    assert isinstance(speed, Speed) and speed.error <= MAX_ERROR
    assert speed.tokens_per_s == pytest.approx(1 / 30e-6, rel=2 * speed.error)
