"""Data residency (tenants[].regions): a request whose tenant's data must stay in some regions
is never sent outside them, by any attempt: the first, a retry, a hedge, a continuation, a
prefill, a pinned follow-up; when none there can take it, a 503 that says so. The pool is built
as the gateway builds it and answers from scripts (tests/resilience/test_failover.py)."""

from __future__ import annotations

import msgspec

from fleetgate.fleet.health import HealthFlag
from fleetgate.http.errors import ReadError
from fleetgate.http.mock import Script, Sent
from fleetgate.lifecycle.events import Finished
from tests.resilience.test_failover import FAST_RETRIES, Harness, role, sse, token

EU = frozenset({"eu-west", "eu-central"})


def ok(k: int, sent: Sent) -> Script:
    return Script(200, [b'{"ok":true}'], [(b"content-type", b"application/json")])


async def test_every_first_pick_stays_in_the_tenant_s_regions() -> None:
    h = Harness(4, ok, regions=["us-east", "eu-west", "us-west", "eu-central"])
    h.residency = EU
    for _ in range(8):
        assert (await h.forward()).status == 200
    assert set(h.sent_to()) == {"b1", "b3"}
    h.residency = None  # another tenant: anywhere
    for _ in range(4):
        await h.forward()
    assert {"b0", "b2"} <= set(h.sent_to())


async def test_a_retry_stays_in_the_regions_even_when_only_elsewhere_is_left() -> None:
    h = Harness(3, lambda k, sent: Script(503, [b'{"e":%d}' % k]), retries=FAST_RETRIES,
                regions=["eu-west", "us-east", "us-west"])  # fmt: skip
    h.residency = EU
    got = await h.forward()
    assert got.status == 503 and h.sent_to() == ["b0"]  # its one backend failed: no other
    h.assert_settled()

    h = Harness(3, lambda k, sent: ok(k, sent) if k else Script(503, [b"{}"]),
                retries=FAST_RETRIES, regions=["eu-west", "us-east", "eu-central"])  # fmt: skip
    h.residency = EU
    assert (await h.forward()).status == 200
    assert sorted(h.sent_to()) == ["b0", "b2"]


async def test_no_backend_in_the_regions_is_a_503_that_says_so() -> None:
    h = Harness(2, ok, regions=["us-east", "us-west"])
    h.residency = EU
    got = await h.forward()
    assert got.status == 503 and h.sent_to() == []
    error = msgspec.json.decode(got.body)["error"]
    assert error["code"] == "region_unavailable"
    assert "eu-central, eu-west" in error["message"] and "not sent to another" in error["message"]
    (done,) = h.of(Finished)
    assert done.status == 503
    h.assert_settled()


async def test_a_backend_without_a_region_label_is_in_none() -> None:
    h = Harness(2, ok)  # no labels
    h.residency = EU
    assert (await h.forward()).status == 503 and h.sent_to() == []


async def test_a_hedge_is_not_sent_outside_the_regions() -> None:
    def answer(k: int, sent: Sent) -> Script:
        return Script(200, sse(role("s0"), token("late", "s0", "stop")), head_delay_s=0.2)

    hedge = {"enabled": True, "min_delay_s": 0.01, "max_delay_s": 0.02}
    h = Harness(2, answer, retries=FAST_RETRIES, hedge=hedge, regions=["eu-west", "us-east"])
    h.residency = EU
    got = await h.forward(stream=True)
    assert got.status == 200 and got.complete
    assert h.sent_to() == ["b0"]  # the one in the region, waited for; no hedge elsewhere


async def test_a_broken_stream_continues_only_in_the_regions() -> None:
    def answer(k: int, sent: Sent) -> Script:
        if k == 0:
            chunks = sse(role("s0"), token("Hello"), token(" wor"), done=False)
            return Script(200, chunks, error=ReadError("reset"), at_chunk=len(chunks))
        return Script(200, sse(role("s1"), token("ld", "s1"), token(".", "s1", "stop")))

    h = Harness(3, answer, retries=FAST_RETRIES, regions=["eu-west", "us-east", "eu-central"])
    h.residency = EU
    got = await h.forward(stream=True)
    assert got.status == 200 and got.complete
    first, then = h.sent_to()
    assert {first, then} == {"b0", "b2"}  # continued in the EU, never on b1

    h = Harness(2, answer, retries=FAST_RETRIES, regions=["eu-west", "us-east"])
    h.residency = EU
    got = await h.forward(stream=True)
    assert h.sent_to() == ["b0"]  # nowhere in the regions to continue: the stream ends, said
    assert got.status == 200 and got.complete
    assert got.events()[-1]["error"]["code"] == "upstream_error"
    h.assert_settled()


async def test_a_prefill_stays_in_the_regions() -> None:
    def answer(k: int, sent: Sent) -> Script:
        return Script(200, [b'{"ok":true}'], [(b"content-type", b"application/json")])

    # b0 (decode, eu), b1 and b2 the prefill backends: us, eu.
    h = Harness(1, answer, prefill=2, regions=["eu-west", "us-east", "eu-central"])
    h.residency = EU
    for _ in range(3):
        await h.forward()
    assert "b1" not in h.sent_to() and {"b0", "b2"} <= set(h.sent_to())


async def test_a_pin_outside_the_regions_is_not_followed() -> None:
    h = Harness(2, ok, regions=["us-east", "eu-west"])
    h.residency, h.pinned = EU, "b0"  # a follow-up pinned to a backend the tenant may not use
    await h.forward()
    assert h.sent_to() == ["b1"]
    h.residency = None
    await h.forward()
    assert h.sent_to()[-1] == "b0"  # without residency the pin holds


async def test_a_picker_that_indexes_the_candidates_still_spreads_within_the_regions() -> None:
    h = Harness(4, ok, policy="weighted_round_robin",
                regions=["eu-west", "us-east", "eu-central", "eu-west"])  # fmt: skip
    h.residency = EU
    for _ in range(9):
        await h.forward()
    assert sorted(set(h.sent_to())) == ["b0", "b2", "b3"]  # each in turn, none in us-east


async def test_with_no_backend_healthy_anywhere_the_503_does_not_blame_residency() -> None:
    h = Harness(2, ok, regions=["eu-west", "us-east"])
    h.residency = EU
    for state in h.cluster.pool.states:  # all of them taken out of service
        state.flags |= HealthFlag.DRAINING
    h.cluster.pool.refresh(0.0)
    got = await h.forward()
    error = msgspec.json.decode(got.body)["error"]
    assert got.status == 503 and error.get("code") != "region_unavailable"
    assert error["message"].startswith("No healthy backend serves 'm'")
