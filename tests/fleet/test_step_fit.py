"""Fitting an engine's speed from its step metrics: the slope of step time against step size."""

from __future__ import annotations

import random

import pytest

from fleetgate.fleet.engine_load import StepTotals
from fleetgate.fleet.step_fit import StepFit


class Engine:
    """Running totals of a GPU whose steps take a + c * tokens, with decoding in every step."""

    def __init__(self, a: float, c: float, rng: random.Random) -> None:
        self.a, self.c, self.rng = a, c, rng
        self.totals = StepTotals(0.0, 0.0, 0.0, 0.0)

    def run(self, steps: int, tokens_per_step: float, batch: int = 8) -> StepTotals:
        step_s = (self.a + self.c * tokens_per_step) * self.rng.uniform(0.97, 1.03)
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
    speed = fit.speed(10)
    assert speed == pytest.approx(1 / c, rel=0.1)


def test_no_speed_before_enough_intervals_nor_without_spread_in_step_size() -> None:
    rng = random.Random(2)
    fit, engine = StepFit(), Engine(0.008, 30e-6, rng)
    fit.add(engine.totals)
    feed(fit, engine, 9, rng)
    assert fit.speed(10) is None
    steady = StepFit()
    for _ in range(30):  # always 64 tokens a step: the slope cannot be told from the fixed cost
        steady.add(engine.run(20, 64))
    assert steady.speed(10) is None


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
    before = fit.speed(10)
    assert before is not None
    engine.a, engine.c = engine.a * 2, engine.c * 2  # every step twice as long
    feed(fit, engine, 40, rng)
    after = fit.speed(10)
    assert after is not None and after < 0.6 * before
