"""The in-process bucket store: all-or-nothing takes, refill over time, debt, forgetting."""

from __future__ import annotations

import math

import pytest

from fleetgate.traffic.store import Bucket, MemoryStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_pays_out_its_size_then_refills_at_its_rate() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    rpm = Bucket("t:rpm", capacity=3, rate_per_s=1.0)
    for left in (2, 1, 0):
        assert store.take_now([rpm], [1]).levels == [left]
    refused = store.take_now([rpm], [1])
    assert not refused.ok
    assert refused.wait_s == pytest.approx(1.0)
    clock.now += 0.5
    assert store.take_now([rpm], [1]).wait_s == pytest.approx(0.5)
    clock.now += 0.5
    assert store.take_now([rpm], [1]).ok
    clock.now += 100  # refills to its size, not beyond
    assert store.take_now([rpm], [0]).levels == [3]


def test_a_take_is_all_or_nothing_over_its_buckets() -> None:
    store = MemoryStore(Clock())
    roomy, tight = Bucket("a", 100, 1.0), Bucket("b", 5, 0.5)
    refused = store.take_now([roomy, tight], [10, 10])
    assert not refused.ok
    assert refused.wait_s == pytest.approx((10 - 5) / 0.5)
    assert store.take_now([roomy], [0]).levels == [100]  # nothing was taken from `a`


def test_giving_back_is_capped_and_taking_more_leaves_a_debt() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    tpm = Bucket("tpm", 100, 10.0)
    store.take_now([tpm], [80])
    store.give_now([tpm], [500])  # more than was taken: capped at the size
    assert store.take_now([tpm], [0]).levels == [100]
    store.give_now([tpm], [-150])  # used 150 more than reserved
    refused = store.take_now([tpm], [10])
    assert refused.levels == [-50]
    assert refused.wait_s == pytest.approx(6.0)  # (10 - -50) / 10


def test_a_budget_does_not_refill_and_waits_forever_within_its_period() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    budget = Bucket("budget:day:1", 10, 0.0, ttl_s=60)
    assert store.take_now([budget], [10]).ok
    clock.now += 30
    refused = store.take_now([budget], [1])
    assert not refused.ok and refused.wait_s == math.inf


def test_full_and_expired_buckets_are_forgotten() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    for i in range(100):
        store.take_now([Bucket(f"k{i}", 10, 1.0)], [5])
    assert len(store) == 100
    clock.now += 6  # all full again
    for _ in range(MemoryStore._SWEEP_EVERY):
        store.take_now([Bucket("live", 1e9, 1.0)], [1])
    assert len(store) == 1
