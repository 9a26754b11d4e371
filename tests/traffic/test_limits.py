"""Rate limits and budgets: reserved on arrival, reconciled at the end, refused with a wait."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from fleetgate.traffic.limits import Limits, OverLimit, PricingSettings, Reservation, duration
from fleetgate.traffic.store import MemoryStore
from fleetgate.traffic.tenants import Tenant, TenantSettings

DAY = 86400.0


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def tenant(**fields: Any) -> Tenant:
    return Tenant.of(msgspec.convert({"name": "acme", **fields}, TenantSettings))


def limits(clock: Clock, wall: Clock | None = None) -> Limits:
    return Limits(MemoryStore(clock), wall or clock, assumed_output_tokens=100)


def lines(held: Reservation) -> list[tuple[bytes, bytes]]:
    """The header lines a reservation adds to its answer, as (name, value) pairs."""
    pairs = [line.split(b": ", 1) for line in held.head.split(b"\r\n") if line]
    return [(name, value) for name, value in pairs]


async def settle(lim: Limits, held: Reservation, prompt: int, output: int) -> None:
    await lim.settle(held, prompt, output)


async def reserve(
    lim: Limits,
    t: Tenant,
    prompt: int = 10,
    out: int | None = 20,
    key: str = "k1",
    pricing: PricingSettings | None = None,
) -> Reservation:
    held = await lim.reserve(t, key, prompt, out, pricing or PricingSettings())
    assert isinstance(held, Reservation), held
    return held


async def refused(
    lim: Limits, t: Tenant, prompt: int = 10, out: int | None = 20, key: str = "k1"
) -> OverLimit:
    held = await lim.reserve(t, key, prompt, out)
    assert isinstance(held, OverLimit), held
    return held


async def test_requests_per_minute_admit_the_burst_then_one_per_refill() -> None:
    clock = Clock()
    lim, t = limits(clock), tenant(limits={"requests_per_minute": 60, "requests_burst": 2})
    await reserve(lim, t)
    held = await reserve(lim, t)
    assert (b"x-ratelimit-remaining-requests", b"0") in lines(held)
    assert (b"x-ratelimit-limit-requests", b"60") in lines(held)
    no = await refused(lim, t)
    assert no.code == "rate_limit_exceeded"
    assert no.retry_after_s == pytest.approx(1.0)
    assert "60 requests per minute for this tenant" in no.message
    clock.now += 1.0
    await reserve(lim, t)


async def test_tokens_are_reserved_then_reconciled_with_what_was_used() -> None:
    clock = Clock()
    lim, t = limits(clock), tenant(limits={"tokens_per_minute": 600})  # 10 tokens/s
    held = await reserve(lim, t, prompt=100, out=400)
    assert (b"x-ratelimit-remaining-tokens", b"100") in lines(held)
    no = await refused(lim, t, prompt=100, out=100)
    assert no.retry_after_s == pytest.approx(10.0)  # 100 short at 10/s
    await settle(lim, held, 100, 50)  # used 150 of the 500 reserved: 350 come back
    again = await reserve(lim, t, prompt=100, out=100)
    assert (b"x-ratelimit-remaining-tokens", b"250") in lines(again)
    await settle(lim, again, 300, 500)  # used 800 of 200: 600 more taken, a debt
    no = await refused(lim, t, prompt=1, out=1)
    assert no.retry_after_s == pytest.approx((2 + 350) / 10)


async def test_a_request_without_max_tokens_reserves_the_assumed_output() -> None:
    lim, t = limits(Clock()), tenant(limits={"tokens_per_minute": 1000})
    held = await reserve(lim, t, prompt=10, out=None)
    assert held.output_tokens == 100
    assert (b"x-ratelimit-remaining-tokens", b"890") in lines(held)


async def test_a_request_larger_than_the_bucket_is_told_to_lower_max_tokens() -> None:
    lim, t = limits(Clock()), tenant(limits={"tokens_per_minute": 1000})
    no = await refused(lim, t, prompt=500, out=4000)
    assert "lower `max_tokens`" in no.message
    assert no.retry_after_s == 0.0  # the bucket is full: waiting will not help


async def test_each_key_has_its_own_limit_beside_the_tenants() -> None:
    lim = limits(Clock())
    t = tenant(limits={"requests_per_minute": 10}, key_limits={"requests_per_minute": 2})
    await reserve(lim, t, key="a")
    await reserve(lim, t, key="a")
    no = await refused(lim, t, key="a")
    assert "for this key" in no.message
    for _ in range(2):
        await reserve(lim, t, key="b")  # another key of the same tenant is not held up


async def test_of_limits_that_refuse_for_as_long_the_one_configured_first_is_named() -> None:
    lim = limits(Clock())
    t = tenant(limits={"tokens_per_minute": 1800, "tokens_burst": 30},
               key_limits={"requests_per_minute": 60, "requests_burst": 1})  # fmt: skip
    await reserve(lim, t, prompt=10, out=20)  # empties both: 30 tokens, 1 request
    # Both refuse the next for 1 s: the tenant's tokens limit (before the key's) is named,
    # and what it says is what helps: this request is larger than it ever allows.
    no = await refused(lim, t, prompt=10, out=30)
    assert no.retry_after_s == pytest.approx(1.0)
    assert "more than the tenant's limit allows at once (30)" in no.message


async def test_a_refused_request_takes_nothing_from_any_limit() -> None:
    lim = limits(Clock())
    t = tenant(limits={"requests_per_minute": 5, "tokens_per_minute": 100})
    await refused(lim, t, prompt=90, out=20)
    held = await reserve(lim, t, prompt=50, out=50)
    assert (b"x-ratelimit-remaining-requests", b"4") in lines(held)
    assert (b"x-ratelimit-remaining-tokens", b"0") in lines(held)


async def test_a_token_budget_ends_with_its_period_and_renews_with_the_next() -> None:
    clock = Clock(now=10 * DAY + 3600)  # one hour into a day
    lim, t = limits(clock), tenant(budget={"period": "day", "tokens": 1000})
    held = await reserve(lim, t, prompt=400, out=400)
    await settle(lim, held, 400, 500)  # 900 spent
    no = await refused(lim, t, prompt=100, out=100)
    assert no.code == "insufficient_quota"
    assert "budget of 1000 tokens" in no.message
    assert no.retry_after_s == pytest.approx(DAY - 3600)
    clock.now += 7200  # the same period, later: the wait counts down
    assert (await refused(lim, t, prompt=100, out=100)).retry_after_s == pytest.approx(
        DAY - 3 * 3600
    )
    clock.now = 11 * DAY + 1
    await reserve(lim, t, prompt=400, out=500)


async def test_a_cost_budget_charges_each_pools_prices() -> None:
    clock = Clock()
    lim, t = limits(clock), tenant(budget={"period": "hour", "cost_usd": 1.0})
    price = PricingSettings(input_per_1m_usd=1000, output_per_1m_usd=2000)
    held = await reserve(lim, t, prompt=200, out=200, pricing=price)  # 0.2 + 0.4 = 0.6 USD
    await settle(lim, held, 200, 100)  # 0.4 used: 0.2 back
    await reserve(lim, t, prompt=200, out=100, pricing=price)  # 0.4 more: 0.8 spent
    no = await lim.reserve(t, "k1", 100, 100, price)  # 0.3 more would pass 1.0
    assert isinstance(no, OverLimit) and "1 USD" in no.message
    free = await lim.reserve(t, "k1", 100, 100, PricingSettings())
    assert isinstance(free, Reservation)  # a free pool costs nothing


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.02, "20ms"), (1.5, "1.5s"), (59, "59s"), (360, "6m0s"), (3725, "1h2m5s")],
)
def test_waits_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text
