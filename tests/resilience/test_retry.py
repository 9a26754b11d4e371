"""Retry policy pieces: backoff bounds and the budget that keeps retries from piling on."""

from __future__ import annotations

import random

from fleetgate.resilience.retry import RetryBudget, RetrySettings, backoff_s

SETTINGS = RetrySettings(backoff_base_s=0.01, backoff_max_s=0.05, budget_ratio=0.2, budget_min=3)


def test_backoff_is_full_jitter_under_a_doubling_ceiling_and_a_cap() -> None:
    rng = random.Random(4)
    for retry, ceiling in ((1, 0.01), (2, 0.02), (3, 0.04), (4, 0.05), (9, 0.05)):
        waits = [backoff_s(SETTINGS, retry, rng) for _ in range(2000)]
        assert min(waits) >= 0.0
        assert max(waits) <= ceiling
        assert max(waits) > 0.9 * ceiling  # the whole range is used
        assert 0.4 * ceiling < sum(waits) / len(waits) < 0.6 * ceiling


def test_the_budget_allows_a_share_of_requests_in_flight_and_a_floor() -> None:
    budget = RetryBudget(SETTINGS)
    assert budget.try_acquire(0)  # the floor: a quiet pool can still retry
    assert budget.try_acquire(0)
    assert budget.try_acquire(10)
    assert budget.retrying == 3
    assert not budget.try_acquire(10)  # 20% of 10 is 2, the floor 3: three is the limit
    assert budget.retrying == 3  # a refusal takes no share
    for _ in range(17):
        assert budget.try_acquire(100)  # 20% of 100 is 20
    assert budget.retrying == 20
    assert not budget.try_acquire(100)
    assert budget.retrying == 20


def test_a_released_share_can_be_taken_again() -> None:
    budget = RetryBudget(SETTINGS)
    for _ in range(3):
        assert budget.try_acquire(0)
    assert not budget.try_acquire(0)
    budget.release()  # one retry ended
    assert budget.retrying == 2
    assert budget.try_acquire(0)
    assert not budget.try_acquire(0)
    for _ in range(3):
        budget.release()
    assert budget.retrying == 0
