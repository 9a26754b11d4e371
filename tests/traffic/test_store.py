"""The spec of a limit store (traffic/store.py's LimitStore), which the in-process store and
the Redis store (tests/traffic/test_redis_store.py) are both held to: all-or-nothing takes,
refill over time, debt, budgets that do not refill, forgetting."""

from __future__ import annotations

import math

import pytest

from fleetgate.traffic.store import Bucket, MemoryStore
from tests.traffic.conftest import Clock, Subject


async def test_a_bucket_pays_out_its_size_then_refills_at_its_rate(subject: Subject) -> None:
    store, rate = subject.store, 4.0
    rpm = Bucket("t:rpm", capacity=3, rate_per_s=rate)
    for left in (2, 1, 0):
        assert (await store.take([rpm], [1])).levels == [subject.about(left, rate)]
    refused = await store.take([rpm], [1])
    assert not refused.ok
    assert refused.wait_s == subject.about(0.25)
    await subject.advance(0.125)
    assert (await store.take([rpm], [1])).wait_s == subject.about(0.125)
    await subject.advance(0.125)
    assert (await store.take([rpm], [1])).ok
    await subject.advance(1.0)  # would refill 4: refills to its size, not beyond
    assert (await store.take([rpm], [0])).levels == [3]


async def test_a_take_is_all_or_nothing_over_its_buckets(subject: Subject) -> None:
    store = subject.store
    roomy, tight = Bucket("a", 100, 1.0), Bucket("b", 5, 0.5)
    refused = await store.take([roomy, tight], [10, 10])
    assert not refused.ok
    assert refused.levels == [100, 5]  # before: both full
    assert refused.wait_s == pytest.approx((10 - 5) / 0.5)
    assert (await store.take([roomy], [0])).levels == [100]  # nothing was taken from `a`
    taken = await store.take([roomy, tight], [5, 5])
    assert taken.ok and taken.levels == [subject.about(95), subject.about(0, 0.5)]


async def test_giving_back_is_capped_and_taking_more_leaves_a_debt(subject: Subject) -> None:
    store, rate = subject.store, 10.0
    tpm = Bucket("tpm", 100, rate)
    await store.take([tpm], [80])
    await store.give([tpm], [500])  # more than was taken: capped at the size
    assert (await store.take([tpm], [0])).levels == [100]
    await store.give([tpm], [-150])  # used 150 more than reserved
    refused = await store.take([tpm], [10])
    assert refused.levels == [subject.about(-50, rate)]
    assert refused.wait_s == subject.about(6.0)  # (10 - -50) / 10
    budget = Bucket("budget", 10, 0.0, ttl_s=60)  # kept while full: the cap shows
    await store.take([budget], [4])
    await store.give([budget], [100])  # capped at 10
    await store.give([budget], [-10])  # so this leaves 0, not 96
    assert (await store.take([budget], [0])).levels == [0]


async def test_a_budget_does_not_refill_within_its_period_then_is_forgotten(
    subject: Subject,
) -> None:
    store = subject.store
    budget = Bucket("budget:day:1", 10, 0.0, ttl_s=1.0)
    assert (await store.take([budget], [10])).ok
    await subject.advance(0.3)
    refused = await store.take([budget], [1])
    assert not refused.ok and refused.wait_s == math.inf
    assert refused.levels == [0]
    await subject.advance(0.8)  # its period (ttl_s) is over: a new one starts full
    assert (await store.take([budget], [1])).levels == [9]


async def test_full_and_expired_memory_buckets_are_swept() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    for i in range(100):
        await store.take([Bucket(f"k{i}", 10, 1.0)], [5])
    assert len(store) == 100
    clock.now += 6  # all full again
    for _ in range(MemoryStore._SWEEP_EVERY):
        await store.take([Bucket("live", 1e9, 1.0)], [1])
    assert len(store) == 1


async def test_a_refusal_says_why_at_the_instant_it_was_decided() -> None:
    """Time passes between reading the clock to decide and reading it again: the refusal's
    levels and wait are those of the decision (read later, the bucket could have refilled,
    and a refusal with no bucket short of its cost became a 500 under load)."""
    times = iter([1000.0, 1000.6, 1001.2, 1001.8])
    store = MemoryStore(lambda: next(times))
    rpm = Bucket("rpm", 1, 1.0)
    assert (await store.take([rpm], [1])).ok  # at 1000.0: empty after
    refused = await store.take([rpm], [1])  # at 1000.6: 0.6 of 1
    assert not refused.ok
    assert refused.levels == [pytest.approx(0.6)]
    assert refused.wait_s == pytest.approx(0.4)


async def test_a_debt_right_after_a_give_back_is_taken_from_the_capped_level() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    tpm = Bucket("tpm", 100, 10.0)
    await store.take([tpm], [80])
    await store.give([tpm], [500])  # capped at 100 when read, at this instant too
    await store.give([tpm], [-150])
    assert (await store.take([tpm], [1])).levels == [pytest.approx(-50)]


async def test_an_account_is_never_swept_and_takes_and_gives_as_its_buckets_do() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    rpm, tpm, other = Bucket("rpm", 10, 1.0), Bucket("tpm", 100, 10.0), Bucket("other", 10, 1.0)
    account = store.account([rpm], [tpm])
    assert (await account.take(40)).levels == [9, 60]  # 1 request, 40 tokens
    await account.give(5)  # used 35: 5 back to the tokens bucket alone
    assert (await store.take([rpm, tpm], [0, 0])).levels == [9, 65]  # the same state, either way
    assert not (await account.take(70)).ok  # short of tokens: all or none, nothing was taken
    assert (await store.take([rpm, tpm], [0, 0])).levels == [9, 65]
    await account.give(-80)  # used 80 more than reserved: a debt, at this instant
    assert (await store.take([tpm], [0])).levels == [-15]
    clock.now += 2.0  # refills 2 requests (capped at 10) and 20 tokens
    assert (await account.take(1)).levels == [9, 4]
    await store.take([other], [1])
    clock.now += 100  # all full again: the unpinned one is forgotten at the next sweep
    store._sweep(clock())
    assert len(store) == 2
    assert (await account.take(100)).levels == [9, 0]
    assert (await store.take([tpm], [1])).ok is False
    with pytest.raises(ValueError, match="refilling"):
        store.account([], [Bucket("budget", 10, 0.0, ttl_s=60)])


@pytest.mark.parametrize("requests", [0, 1, 2])
async def test_an_account_of_any_shape_takes_all_or_none_in_its_order(requests: int) -> None:
    clock = Clock()
    store = MemoryStore(clock)
    counted = [Bucket(f"rpm{i}", 2 + i, 1.0) for i in range(requests)]
    sized = [Bucket("tpm", 100, 10.0), Bucket("key:tpm", 50, 10.0)][: 3 - requests]
    account = store.account(counted, sized)
    expected = [*(1 + i for i in range(requests)), *[70, 20][: len(sized)]]
    assert (await account.take(30)).levels == expected
    if len(sized) == 2:
        assert not (await account.take(30)).ok  # the key's 20 tokens are short: nothing taken
        assert (await store.take(sized, [0, 0])).levels == [70, 20]
    if requests:
        assert (await account.take(1)).ok  # the first requests bucket is empty now
        assert not (await account.take(1)).ok
    clock.now += 1.0  # a second refills 1 request and 10 tokens to each
    assert (await account.take(0)).ok
