"""The scenarios of test_failover.py in virtual time (tests/virtual_time.py): the same pool,
failover and mock transport, on the lifecycle's Clock over a loop whose clock jumps, with
upstreams that answer after their scripted latencies and deadlines that the transport keeps.
Each test asserts when things happened, to the virtual instant, and takes milliseconds of real
time (`in_virtual_time` checks it) however many virtual seconds it covers."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgspec
import pytest

from fleetgate.clock import LoopClock
from fleetgate.http.errors import ConnectError, ReadError
from fleetgate.http.mock import Script, Sent
from fleetgate.lifecycle.events import (
    AttemptEnded,
    AttemptStarted,
    Continued,
    Finished,
    FirstToken,
    Hedged,
    Retried,
)
from fleetgate.resilience.retry import RetrySettings, backoff_s
from fleetgate.upstream.timeouts import Timeouts
from tests.resilience.test_failover import Harness, role, sse, token
from tests.virtual_time import in_virtual_time

RETRIES: dict[str, Any] = {"max_attempts": 3, "backoff_base_s": 2.0, "backoff_max_s": 4.0}
HEDGE = {"enabled": True, "min_delay_s": 0.1, "max_delay_s": 0.5}  # 0.5 s until TTFTs are known
OK = Script(200, [b'{"ok":true}'], [(b"content-type", b"application/json")])


def at(seconds: float) -> Any:
    """A virtual instant (sums of float delays may differ from the written sum in the last
    bit)."""
    return pytest.approx(seconds, abs=1e-9)


def first_backoff() -> float:
    """The wait before the first retry: what Harness's Failover draws (its rng: Random(2))."""
    return backoff_s(RetrySettings(**RETRIES), 1, random.Random(2))


def with_stream_text(events: list[Any]) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e != "[DONE]")


@in_virtual_time
async def test_a_failed_attempt_is_retried_elsewhere_after_its_backoff(clock: LoopClock) -> None:
    def answer(k: int, sent: Sent) -> Script:
        if k == 0:
            return Script(503, [b'{"error":"busy"}'], head_delay_s=0.5)
        return Script(200, OK.chunks, OK.headers, head_delay_s=1.0)

    h = Harness(3, answer, clock=clock, retries=RETRIES)
    got = await h.forward()
    assert (got.status, got.body) == (200, b'{"ok":true}')
    wait = first_backoff()
    assert 0.0 < wait <= 2.0
    (retried,) = h.of(Retried)
    assert retried.at == at(0.5)  # the 503 came at 0.5 s
    starts = h.of(AttemptStarted)
    assert [s.at for s in starts] == [0.0, at(0.5 + wait)]  # the retry waited its backoff
    assert starts[0].backend is not starts[1].backend
    (done,) = h.of(Finished)
    assert done.at == at(0.5 + wait + 1.0) and clock.now() == done.at
    h.assert_settled()


@in_virtual_time
async def test_a_refused_connection_fails_over_and_the_last_failure_reaches_the_client(
    clock: LoopClock,
) -> None:
    def answer(k: int, sent: Sent) -> Script:
        if k == 0:
            return Script(error=ConnectError("refused"))
        return Script(502, [b'{"e":1}'], head_delay_s=1.5)

    h = Harness(2, answer, clock=clock, retries=RETRIES)
    got = await h.forward()
    # Two backends, three attempts allowed: none is left untried after the second.
    assert (got.status, got.body) == (502, b'{"e":1}')
    assert sorted(h.sent_to()) == ["b0", "b1"]
    ends = h.of(AttemptEnded)
    assert [(e.error, e.status, e.at) for e in ends] == [
        ("connect", 0, 0.0), (None, 502, at(first_backoff() + 1.5))
    ]  # fmt: skip
    (done,) = h.of(Finished)
    assert (done.status, done.outcome, done.at) == (502, "failed", ends[-1].at)
    h.assert_settled()


@in_virtual_time
async def test_a_late_first_token_is_hedged_at_exactly_the_hedge_delay(clock: LoopClock) -> None:
    def answer(k: int, sent: Sent) -> Script:
        if k == 0:  # the first pick would answer only after 5 s
            return Script(200, sse(token("slow")), head_delay_s=5.0)
        return Script(200, sse(role("s1"), token("fast", "s1"), token("!", "s1", "stop")),
                      head_delay_s=0.25)  # fmt: skip

    h = Harness(2, answer, clock=clock, retries=RETRIES, hedge=HEDGE)
    got = await h.forward(stream=True)
    assert got.status == 200 and got.complete
    assert with_stream_text(got.events()) == "fast!"
    slow, fast = h.sent_to()
    (hedged,) = h.of(Hedged)
    assert (hedged.backend, hedged.at) == (fast, 0.5)  # the delay, to the instant
    (first,) = h.of(FirstToken)
    assert (first.at, first.sent_at, first.ttft_s) == (at(0.75), 0.5, at(0.75))
    ends = {e.backend: e for e in h.of(AttemptEnded)}
    assert (ends[slow].error, ends[slow].at) == ("cancelled", at(0.75))  # stopped as fast won
    (done,) = h.of(Finished)
    assert (done.backend, done.at) == (fast, at(0.75))
    h.assert_settled()


@in_virtual_time
async def test_a_first_token_before_the_hedge_delay_sends_no_hedge(clock: LoopClock) -> None:
    h = Harness(2, lambda k, sent: Script(200, sse(token("hi")), head_delay_s=0.3), clock=clock,
                retries=RETRIES, hedge=HEDGE)  # fmt: skip
    got = await h.forward(stream=True)
    assert got.complete and with_stream_text(got.events()) == "hi"
    await clock.sleep(60.0)  # long after the delay: still no second attempt
    assert len(h.transport.sent) == 1 and h.of(Hedged) == []
    assert h.of(Finished)[0].at == at(0.3)
    h.assert_settled()


@in_virtual_time
async def test_a_stream_broken_mid_answer_is_continued_from_where_it_broke(
    clock: LoopClock,
) -> None:
    def answer(k: int, sent: Sent) -> Script:
        if k == 0:  # a token every 0.2 s, then the connection drops
            chunks = sse(role("s0"), token("Hello"), token(" wor"), done=False)
            return Script(200, chunks, chunk_delay_s=0.2, error=ReadError("reset"),
                          at_chunk=len(chunks))  # fmt: skip
        rest = sse(role("s1"), token("ld", "s1"), token(".", "s1", "stop"))
        return Script(200, rest, head_delay_s=0.1, chunk_delay_s=0.2)

    h = Harness(2, answer, clock=clock, retries=RETRIES)
    got = await h.forward(stream=True)
    assert got.complete and with_stream_text(got.events()) == "Hello world."
    asked = msgspec.json.decode(h.transport.sent[1].body)
    assert asked["messages"][-1] == {"role": "assistant", "content": "Hello wor"}
    (continued,) = h.of(Continued)
    assert continued.at == at(0.6)  # at once when it broke: continuation does not back off
    ends = h.of(AttemptEnded)
    assert [(e.kind, e.error, e.at) for e in ends] == [
        ("first", "read", at(0.6)), ("continuation", None, at(0.6 + 0.1 + 4 * 0.2))
    ]  # fmt: skip
    h.assert_settled()


@in_virtual_time
async def test_a_backend_silent_past_the_idle_timeout_is_continued_at_that_deadline(
    clock: LoopClock,
) -> None:
    def answer(k: int, sent: Sent) -> Script:
        if k == 0:  # two tokens, then nothing ever again
            return Script(200, sse(role("s0"), token("Hel"), done=False), hang=True)
        return Script(200, sse(role("s1"), token("lo", "s1", "stop")), head_delay_s=0.5)

    h = Harness(2, answer, clock=clock, retries=RETRIES, idle_timeout_s=3.0)
    got = await h.forward(stream=True)
    assert got.complete and with_stream_text(got.events()) == "Hello"
    first, second = h.of(AttemptEnded)
    assert (first.error, first.at) == ("timeout", 3.0)  # silent for 3 s after its last token
    assert (second.kind, second.at) == ("continuation", 3.5)
    h.assert_settled()


@in_virtual_time
async def test_a_head_later_than_the_first_byte_timeout_is_a_504_at_that_deadline(
    clock: LoopClock,
) -> None:
    h = Harness(2, lambda k, sent: Script(200, [b"{}"], head_delay_s=30.0), clock=clock,
                retries={**RETRIES, "max_attempts": 1}, first_byte_timeout_s=2.0)  # fmt: skip
    got = await h.forward()
    assert got.status == 504
    error = msgspec.json.decode(got.body)["error"]
    assert error["code"] == "upstream_timeout"
    assert "no answer within 2 s (the first-byte timeout)" in error["message"]  # the client's
    (ended,) = h.of(AttemptEnded)
    assert (ended.error, ended.at) == ("timeout", 2.0)
    assert h.of(Finished)[0].at == 2.0 and clock.now() == 2.0  # not 30 s
    h.assert_settled()


@in_virtual_time
async def test_a_body_still_coming_at_the_total_timeout_is_cut_at_that_deadline(
    clock: LoopClock,
) -> None:
    slow_body = Script(200, [b"{", b'"a"', b":", b"1", b"}"], chunk_delay_s=1.0)
    h = Harness(1, lambda k, sent: slow_body, clock=clock, retries={"max_attempts": 1},
                total_timeout_s=3.0)  # fmt: skip
    got = await h.forward()
    assert got.status == 504
    message = msgspec.json.decode(got.body)["error"]["message"]
    assert "the answer took longer than the total timeout of 3 s" in message
    (ended,) = h.of(AttemptEnded)
    assert (ended.error, ended.at) == ("timeout", 3.0)


@in_virtual_time
async def test_a_timeout_the_client_shortened_is_the_client_s(clock: LoopClock) -> None:
    h = Harness(2, lambda k, sent: Script(200, [b"{}"], head_delay_s=2.0), clock=clock,
                retries={"max_attempts": 1}, first_byte_timeout_s=10.0)  # fmt: skip
    pool = h.cluster.timeouts
    shorter = Timeouts(0.5, pool.total_s, pool.idle_s, pool.connect_s)
    assert (await h.forward(timeouts=shorter)).status == 504
    (ended,) = h.of(AttemptEnded)
    assert (ended.error, ended.at) == ("client_timeout", 0.5)
    assert all(s.healthy for s in h.cluster.pool.states)


@in_virtual_time
async def test_a_retry_holds_its_share_of_the_budget_while_it_waits_and_runs(
    clock: LoopClock,
) -> None:
    retrying: list[int] = []

    def answer(k: int, sent: Sent) -> Script:
        retrying.append(h.cluster.budget.retrying)  # as the attempt is sent
        return Script(503) if k == 0 else Script(200, [b"{}"], head_delay_s=10.0)

    h = Harness(2, answer, clock=clock, retries=RETRIES)
    task = asyncio.ensure_future(h.forward())
    await clock.sleep(first_backoff() + 5.0)  # the retry is waiting for its answer now
    assert h.cluster.budget.retrying == 1 and retrying == [0, 1]
    assert (await task).status == 200
    assert clock.now() == at(first_backoff() + 10.0)
    h.assert_settled()  # released when it ended


@in_virtual_time
async def test_a_client_that_leaves_a_hedged_request_ends_both_attempts_then(
    clock: LoopClock,
) -> None:
    h = Harness(2, lambda k, sent: Script(200, sse(token("late")), head_delay_s=30.0),
                clock=clock, retries=RETRIES, hedge=HEDGE)  # fmt: skip
    task = asyncio.ensure_future(h.failover.forward(h.cluster, h.exchange(stream=True)))
    await clock.sleep(2.0)
    assert len(h.transport.sent) == 2  # hedged at 0.5 s
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [(e.error, e.at) for e in h.of(AttemptEnded)] == [("cancelled", 2.0)] * 2
    (done,) = h.of(Finished)
    assert (done.status, done.outcome, done.at) == (499, "client_closed", 2.0)
    h.assert_settled()
