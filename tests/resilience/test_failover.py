"""The request lifecycle's orchestration over a mock transport: retries, the retry budget,
hedging, continuation and a client that leaves, with the pool built as the gateway builds it
(serve.build_clusters) and every event recorded. Only the sockets are stand-ins: upstreams
answer from scripts (http/mock.py) and the client's connection is a buffer that a real
ResponseWriter writes into and a real HTTP parser reads back. When each step happens, to the
instant, is tested in virtual time: test_failover_in_virtual_time.py."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import httptools
import msgspec
import pytest

from fleetgate.clock import Clock, LoopClock
from fleetgate.config import parse_config
from fleetgate.fleet.backend import Backend
from fleetgate.http.errors import ConnectError, LocalExhaustion, ReadError
from fleetgate.http.mock import MockTransport, Script, Sent
from fleetgate.http.writer import ResponseWriter
from fleetgate.lifecycle.events import (
    AttemptEnded,
    Continued,
    Event,
    Finished,
    Hedged,
    Retried,
    RetryRefused,
    Routed,
)
from fleetgate.lifecycle.hooks import Hooks
from fleetgate.resilience.cluster import Cluster
from fleetgate.resilience.continuation import Continuation
from fleetgate.resilience.failover import Failover
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.registry import default_registry
from fleetgate.serve import ResolvedPool, build_clusters
from fleetgate.upstream.attempt import Attempts, Exchange
from fleetgate.upstream.timeouts import Timeouts

CHAT = msgspec.json.encode(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
)


class ClientSocket:
    """The client's end of the connection: what the gateway wrote, and whether it is paused."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        self.data += data

    def writelines(self, parts: Sequence[bytes]) -> None:
        for part in parts:
            self.data += part

    def when_drained(self, callback: Callable[[], None]) -> None:
        callback()

    def abort(self) -> None:
        self.closed = True


class Answer:
    """The response the client received, parsed by httptools as a client would."""

    def __init__(self, raw: bytes) -> None:
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.body = b""
        self.complete = False
        parser = httptools.HttpResponseParser(self)
        parser.feed_data(raw)
        self.status = parser.get_status_code()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True

    def events(self) -> list[Any]:
        """The stream's data payloads, decoded ([DONE] as the string)."""
        out: list[Any] = []
        for event in self.body.split(b"\n\n"):
            if event.startswith(b"data: "):
                payload = event[6:]
                out.append("[DONE]" if payload == b"[DONE]" else msgspec.json.decode(payload))
        return out


def sse(*chunks: dict[str, Any], done: bool = True) -> list[bytes]:
    events = [b"data: " + msgspec.json.encode(c) + b"\n\n" for c in chunks]
    return [*events, b"data: [DONE]\n\n"] if done else events


def token(text: str, stream_id: str = "s0", finish: str | None = None) -> dict[str, Any]:
    return {
        "id": stream_id,
        "created": 7,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }


def role(stream_id: str) -> dict[str, Any]:
    return {
        "id": stream_id,
        "created": 9,
        "choices": [{"index": 0, "delta": {"role": "assistant"}}],
    }


class Harness:
    """One pool of `n` backends (b0, b1, ...) behind a mock transport; `answer(k, sent)` is the
    script of the k-th request sent upstream (0 for the first)."""

    def __init__(
        self,
        n: int,
        answer: Callable[[int, Sent], Script],
        prefill: int = 0,
        clock: Clock | None = None,
        regions: Sequence[str] = (),
        **pool: Any,
    ) -> None:
        self.clock = clock = clock or LoopClock()
        urls = [f"http://10.0.0.{i}:8000" for i in range(n + prefill)]
        where = [{"region": r} for r in regions] or [{}] * len(urls)  # b{i}'s `region` label
        backends = tuple(Backend(f"b{i}", u, ("m",), labels=where[i]) for i, u in enumerate(urls))
        section = {"model": "m", "policy": "round_robin", **pool,
                   "backends": [{"url": u} for u in urls[:n]]}  # fmt: skip
        if prefill:  # b{n}, ...: the prefill backends of a disaggregated pool
            section["prefill"] = {"backends": [{"url": u} for u in urls[n:]]}
        config = parse_config({"pools": [section]})
        self.events: list[Event] = []

        def record(hooks: Hooks) -> None:
            hooks.subscribe(Event, self.events.append)

        def handler(sent: Sent) -> Script:
            return answer(len(self.transport.sent) - 1, sent)

        self.transport = MockTransport(handler, clock)
        resolved = ResolvedPool(config.pools[0], backends[:n], backends[n:])
        self.cluster: Cluster = build_clusters(
            [resolved], default_registry(), random.Random(1), transport=self.transport,
            clock=clock, subscribe=record,
        )["m"]  # fmt: skip
        attempts = Attempts(self.transport, clock.now)
        continuation = Continuation(attempts, clock.now)
        self.failover = Failover(attempts, continuation, clock, random.Random(2))
        self.socket = ClientSocket()
        self.residency: frozenset[str] | None = None  # the regions its requests may go to
        self.pinned: str | None = None  # the backend its requests are pinned to

    def exchange(
        self,
        stream: bool,
        body: bytes = CHAT,
        timeouts: Timeouts | None = None,
        endpoint: str = "chat",
    ) -> Exchange:
        routing = RoutingRequest("m", endpoint, stream, 10, None, b'[{"content":"hi"}]')
        routing.regions, routing.pinned = self.residency, self.pinned
        writer = ResponseWriter(self.socket, keep_alive=True)
        c = self.cluster
        return Exchange(
            "m", routing, b"/v1/chat/completions", [], body, b"r1", writer, self.clock.now(),
            timeouts or c.timeouts, c.emit, c.pool.board, c.timeouts,
        )  # fmt: skip

    async def forward(
        self,
        stream: bool = False,
        body: bytes = CHAT,
        timeouts: Timeouts | None = None,
        endpoint: str = "chat",
    ) -> Answer:
        self.socket.data.clear()
        exchange = self.exchange(stream, body, timeouts, endpoint)
        await self.failover.forward(self.cluster, exchange)
        return Answer(bytes(self.socket.data))

    def sent_to(self) -> list[str]:
        """The backends the requests went to, in order."""
        return [f"b{s.origin.host.rsplit('.', 1)[1]}" for s in self.transport.sent]

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def assert_settled(self) -> None:
        """Every attempt's accounting was undone when it ended, and the request's one
        Finished came after everything else."""
        pools = [self.cluster.pool]
        if self.cluster.prefill is not None:
            pools.append(self.cluster.prefill.router.pool)
        for pool in pools:
            assert pool.in_flight == 0
            for _, load in pool.loads():
                assert (load.in_flight, load.in_flight_tokens, load.pending_prefill) == (0, 0, 0)
        assert self.cluster.budget.retrying == 0
        assert len(self.of(Finished)) == 1
        assert isinstance(self.events[-1], Finished)


FAST_RETRIES = {"max_attempts": 3, "backoff_base_s": 0.001, "backoff_max_s": 0.002}


async def test_a_failed_attempt_is_retried_on_a_backend_not_tried_yet() -> None:
    def answer(i: int, sent: Sent) -> Script:
        if i == 0:
            return Script(503, [b'{"error":"busy"}'])
        return Script(200, [b'{"ok":', b"true}"], [(b"content-type", b"application/json")])

    h = Harness(3, answer, retries=FAST_RETRIES)
    got = await h.forward()
    assert (got.status, got.body) == (200, b'{"ok":true}')
    first, second = h.sent_to()
    assert first != second
    assert [e.status for e in h.of(Retried)] == [503]
    ends = h.of(AttemptEnded)
    assert [(e.backend, e.kind, e.status) for e in ends] == [
        (first, "first", 503), (second, "retry", 200)
    ]  # fmt: skip
    (done,) = h.of(Finished)
    assert (done.status, done.backend, done.outcome) == (200, second, "answered")
    h.assert_settled()


async def test_the_last_attempt_s_failure_reaches_the_client_as_it_came() -> None:
    h = Harness(2, lambda k, sent: Script(502, [b'{"e":%d}' % k]), retries=FAST_RETRIES)
    got = await h.forward()
    # Two backends, three attempts allowed: after both, no backend is left untried.
    assert (got.status, got.body) == (502, b'{"e":1}')
    assert sorted(h.sent_to()) == ["b0", "b1"]
    (done,) = h.of(Finished)
    assert (done.status, done.outcome) == (502, "failed")
    h.assert_settled()


async def test_a_spent_budget_refuses_the_retry_but_a_failed_connect_is_free() -> None:
    no_budget = {**FAST_RETRIES, "budget_min": 0, "budget_ratio": 0.0}

    h = Harness(2, lambda k, sent: Script(503 if k == 0 else 200), retries=no_budget)
    got = await h.forward()
    assert got.status == 503  # the retry would have added work: refused
    assert len(h.sent_to()) == 1
    assert len(h.of(RetryRefused)) == 1
    h.assert_settled()

    def refused(k: int, sent: Sent) -> Script:
        return Script(error=ConnectError("refused")) if k == 0 else Script(200, [b"{}"])

    h = Harness(2, refused, retries=no_budget)
    got = await h.forward()
    assert got.status == 200  # the first connect did no work: its retry costs no budget
    assert sorted(h.sent_to()) == ["b0", "b1"]
    assert h.of(RetryRefused) == []
    h.assert_settled()


async def test_a_late_first_token_is_hedged_and_the_first_to_answer_keeps_the_client() -> None:
    def answer(k: int, sent: Sent) -> Script:
        if k == 0:  # the first pick is slow to answer at all
            return Script(200, sse(token("slow")), head_delay_s=5.0)
        return Script(200, sse(role("s1"), token("fast", "s1"), token("!", "s1", "stop")))

    hedge = {"enabled": True, "min_delay_s": 0.01, "max_delay_s": 0.02}
    h = Harness(2, answer, retries=FAST_RETRIES, hedge=hedge)
    started = time.monotonic()
    got = await h.forward(stream=True)
    assert time.monotonic() - started < 2.0  # did not wait for the slow one
    assert got.status == 200 and got.complete
    texts = [e["choices"][0]["delta"].get("content") for e in got.events()[:-1]]
    assert texts == [None, "fast", "!"]
    assert got.events()[-1] == "[DONE]"
    slow, fast = h.sent_to()
    assert [e.backend for e in h.of(Hedged)] == [fast]
    ends = {e.backend: e for e in h.of(AttemptEnded)}
    assert ends[slow].error == "cancelled"  # the loser was stopped, not failed
    assert ends[fast].error is None and ends[fast].kind == "hedge"
    (done,) = h.of(Finished)
    assert done.backend == fast and done.ttft_s is not None
    h.assert_settled()


async def test_a_stream_broken_mid_answer_continues_on_another_backend_as_one_stream() -> None:
    def answer(k: int, sent: Sent) -> Script:
        if k == 0:
            chunks = sse(role("s0"), token("Hello"), token(" wor"), done=False)
            return Script(200, chunks, error=ReadError("reset"), at_chunk=len(chunks))
        rest = sse(role("s1"), token("ld", "s1"), token(".", "s1", "stop"),
                   {"id": "s1", "choices": [], "usage": {"prompt_tokens": 9,
                                                         "completion_tokens": 2}})  # fmt: skip
        return Script(200, rest)

    h = Harness(2, answer, retries=FAST_RETRIES)
    got = await h.forward(stream=True)
    assert got.status == 200 and got.complete
    events = got.events()
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["id"] for c in chunks} == {"s0"}  # one stream: the first backend's id throughout
    roles = [c for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
    assert len(roles) == 1
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello world."
    assert chunks[-1]["usage"]["completion_tokens"] == 4  # the two streamed before count
    # The second backend was asked to continue the partial answer, not to start over.
    asked = msgspec.json.decode(h.transport.sent[1].body)
    assert asked["messages"][-1] == {"role": "assistant", "content": "Hello wor"}
    assert asked["continue_final_message"] is True and asked["max_tokens"] == 8
    _, other = h.sent_to()
    assert [(e.backend, e.tokens) for e in h.of(Continued)] == [(other, 2)]
    ends = h.of(AttemptEnded)
    assert [(e.kind, e.error) for e in ends] == [("first", "read"), ("continuation", None)]
    (done,) = h.of(Finished)
    assert (done.status, done.backend, done.outcome) == (200, other, "answered")
    h.assert_settled()


async def test_a_stream_that_cannot_go_on_ends_with_an_error_event_never_silently() -> None:
    def answer(k: int, sent: Sent) -> Script:
        chunks = sse(role(f"s{k}"), token("Hi", f"s{k}"), done=False)
        return Script(200, chunks, error=ReadError("reset"), at_chunk=len(chunks))

    h = Harness(2, answer, retries=FAST_RETRIES)
    got = await h.forward(stream=True)
    assert got.status == 200 and got.complete
    last = got.events()[-1]
    assert last["error"]["code"] == "upstream_error"
    assert "could not go on" in last["error"]["message"]
    h.assert_settled()


async def test_a_responses_stream_cut_mid_answer_ends_with_its_own_error_event() -> None:
    def answer(k: int, sent: Sent) -> Script:
        created = b'event: response.created\ndata: {"type":"response.created"}\n\n'
        delta = b'event: response.output_text.delta\ndata: {"type":"x","delta":"Hi"}\n\n'
        return Script(200, [created, delta], error=ReadError("reset"), at_chunk=2)

    h = Harness(2, answer, retries=FAST_RETRIES)
    body = b'{"model":"m","input":"hi","stream":true,"seed":1}'
    got = await h.forward(stream=True, body=body, endpoint="responses")
    assert got.complete and len(h.transport.sent) == 1  # not continued, not replayed
    tail = bytes(h.socket.data).rsplit(b"event: error\ndata: ", 1)[1]
    error = msgspec.json.decode(tail.split(b"\n\n")[0])
    assert error["type"] == "error" and error["sequence_number"] == 2
    assert "could not go on" in error["message"]
    h.assert_settled()


async def test_a_client_that_leaves_cancels_the_attempt_without_blaming_the_backend() -> None:
    arrived = asyncio.Event()

    def answer(k: int, sent: Sent) -> Script:
        arrived.set()
        return Script(200, [b"{}"], head_delay_s=30.0)

    h = Harness(1, answer)
    for _ in range(6):  # more than the failures in a row that would eject it
        arrived.clear()
        task = asyncio.get_running_loop().create_task(
            h.failover.forward(h.cluster, h.exchange(stream=False))
        )
        await arrived.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    ends = h.of(AttemptEnded)
    assert [e.error for e in ends] == ["cancelled"] * 6
    assert {(e.status, e.outcome) for e in h.of(Finished)} == {(499, "client_closed")}
    pool = h.cluster.pool
    assert pool.in_flight == 0 and pool.loads()[0][1].in_flight == 0
    assert not pool.states[0].flags  # cancelled attempts are no failures: not ejected


async def test_every_pick_is_reported_with_the_scores_that_chose_it() -> None:
    h = Harness(2, lambda k, sent: Script(200, [b"{}"]), policy="least_loaded")
    await h.forward()
    (routed,) = h.of(Routed)
    assert routed.kind == "first" and routed.backend is not None
    assert set(routed.scores) == {"queue", "kv_cache"}
    assert all(0.0 <= s <= 1.0 for s in routed.scores.values())


async def test_a_client_that_leaves_a_hedged_request_ends_both_attempts_before_finished() -> None:
    both = asyncio.Event()

    def answer(k: int, sent: Sent) -> Script:
        if k == 1:
            both.set()
        return Script(200, sse(token("late")), head_delay_s=30.0)

    hedge = {"enabled": True, "min_delay_s": 0.01, "max_delay_s": 0.02}
    h = Harness(2, answer, retries=FAST_RETRIES, hedge=hedge)
    task = asyncio.get_running_loop().create_task(
        h.failover.forward(h.cluster, h.exchange(stream=True))
    )
    await both.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [e.error for e in h.of(AttemptEnded)] == ["cancelled", "cancelled"]
    (done,) = h.of(Finished)
    assert (done.status, done.outcome) == (499, "client_closed")
    h.assert_settled()


async def test_a_client_that_leaves_during_a_continuation_is_recorded_as_gone() -> None:
    continuing = asyncio.Event()

    def answer(k: int, sent: Sent) -> Script:
        if k == 0:
            chunks = sse(role("s0"), token("Hel"), done=False)
            return Script(200, chunks, error=ReadError("reset"), at_chunk=len(chunks))
        continuing.set()
        return Script(200, sse(token("lo", "s1")), head_delay_s=30.0)

    h = Harness(2, answer, retries=FAST_RETRIES)
    task = asyncio.get_running_loop().create_task(
        h.failover.forward(h.cluster, h.exchange(stream=True))
    )
    await continuing.wait()
    assert h.of(Continued)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (done,) = h.of(Finished)
    assert (done.status, done.outcome) == (499, "client_closed")  # not "answered": it left
    h.assert_settled()


async def test_a_continuation_refused_with_a_4xx_is_not_the_backend_s_fault() -> None:
    def answer(k: int, sent: Sent) -> Script:
        if k == 0:
            chunks = sse(role("s0"), token("Hi"), done=False)
            return Script(200, chunks, error=ReadError("reset"), at_chunk=len(chunks))
        return Script(400, [b'{"error":{"message":"continue_final_message unsupported"}}'])

    h = Harness(2, answer, retries=FAST_RETRIES)
    got = await h.forward(stream=True)
    assert "could not go on" in got.events()[-1]["error"]["message"]
    ended = h.of(AttemptEnded)[-1]
    assert (ended.kind, ended.status, ended.error) == ("continuation", 400, None)
    h.assert_settled()


async def test_a_disaggregated_request_takes_the_prefill_backend_s_kv_handoff() -> None:
    handoff = {"remote_engine_id": "p0", "remote_block_ids": [1, 2]}

    def answer(k: int, sent: Sent) -> Script:
        asked = msgspec.json.decode(sent.body)
        if k == 0:  # the prefill half: one token, not streamed, asking to keep the KV
            assert sent.origin.host == "10.0.0.2"
            assert (asked["max_tokens"], asked["stream"]) == (1, False)
            assert asked["kv_transfer_params"]["do_remote_decode"] is True
            return Script(200, [msgspec.json.encode({"kv_transfer_params": handoff})])
        assert asked["kv_transfer_params"] == handoff  # the decode half gets the handoff
        return Script(200, [b"{}"])

    h = Harness(2, answer, prefill=1, retries=FAST_RETRIES)
    assert (await h.forward()).status == 200
    kinds = [(e.kind, e.backend) for e in h.of(AttemptEnded)]
    assert kinds[0] == ("prefill", "b2") and kinds[1][0] == "first"
    h.assert_settled()


async def test_a_failed_prefill_leaves_the_body_to_the_decode_backend() -> None:
    def answer(k: int, sent: Sent) -> Script:
        if k == 0:
            return Script(error=ConnectError("refused"))
        assert "kv_transfer_params" not in msgspec.json.decode(sent.body)
        return Script(200, [b"{}"])

    h = Harness(1, answer, prefill=1, retries=FAST_RETRIES)
    assert (await h.forward()).status == 200
    assert [e.error for e in h.of(AttemptEnded)] == ["connect", None]
    h.assert_settled()


async def test_a_timeout_the_client_shortened_is_the_client_s_and_the_pool_s_own_is_not() -> None:
    slow = Script(200, [b"{}"], head_delay_s=0.2)
    h = Harness(2, lambda k, sent: slow, retries={**FAST_RETRIES, "max_attempts": 1},
                first_byte_timeout_s=0.5)  # fmt: skip
    pool = h.cluster.timeouts
    shorter = Timeouts(0.01, pool.total_s, pool.idle_s, pool.connect_s)
    assert (await h.forward(timeouts=shorter)).status == 504
    h2 = Harness(2, lambda k, sent: slow, retries={**FAST_RETRIES, "max_attempts": 1},
                 first_byte_timeout_s=0.01)  # fmt: skip
    assert (await h2.forward()).status == 504
    assert [e.error for e in h.of(AttemptEnded) + h2.of(AttemptEnded)] == [
        "client_timeout", "timeout"
    ]  # fmt: skip
    assert all(s.healthy for s in h.cluster.pool.states)


async def test_a_body_every_backend_fails_on_alike_ejects_none_of_them() -> None:
    h = Harness(3, lambda k, sent: Script(500, [b'{"error":"engine crashed"}']),
                retries=FAST_RETRIES)  # fmt: skip
    for _ in range(10):  # 30 answers of 500: five in a row eject a backend of its own fault
        assert (await h.forward()).status == 500
    ends = h.of(AttemptEnded)
    assert [e.prior_status for e in ends[:3]] == [0, 500, 500]
    assert ends[1].prior_backend == ends[0].backend and ends[2].prior_backend is None
    assert all(s.healthy for s in h.cluster.pool.states)


async def test_the_gateway_out_of_sockets_answers_503_without_blaming_a_backend() -> None:
    out = Script(error=LocalExhaustion("the gateway is out of resources: Too many open files"))
    h = Harness(2, lambda k, sent: out, retries=FAST_RETRIES)
    for _ in range(10):
        got = await h.forward()
        assert (got.status, got.headers[b"retry-after"]) == (503, b"1")
    assert "retry shortly" in msgspec.json.decode(got.body)["error"]["message"]
    assert {e.error for e in h.of(AttemptEnded)} == {"local_resources"}
    assert all(s.healthy for s in h.cluster.pool.states)


async def test_an_upstream_s_headers_reach_the_client_whole_answer_or_stream() -> None:
    extra = [(b"openai-processing-ms", b"41"), (b"keep-alive", b"timeout=5"),
             (b"content-type", b"text/event-stream")]  # fmt: skip
    h = Harness(1, lambda k, sent: Script(200, sse(token("a")) if k else [b"{}"], extra))
    got = await h.forward()
    assert (got.headers[b"openai-processing-ms"], got.headers[b"x-request-id"]) == (b"41", b"r1")
    assert b"keep-alive" not in got.headers
    streamed = await h.forward(stream=True)
    assert streamed.headers[b"openai-processing-ms"] == b"41"
    head = bytes(h.socket.data).split(b"\r\n\r\n", 1)[0]
    assert head.count(b"content-type") == 1 and b"keep-alive" not in head


def choice_token(index: int, text: str, stream_id: str, finish: str | None = None) -> Any:
    chunk = token(text, stream_id, finish)
    chunk["choices"][0]["index"] = index
    return chunk


N2 = msgspec.json.encode(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "n": 2,
     "seed": 3, "stream": True, "stream_options": {"include_usage": True}}
)  # fmt: skip


def texts(chunks: list[Any]) -> dict[int, str]:
    out: dict[int, str] = {}
    for chunk in chunks:
        for c in chunk.get("choices") or ():
            out[c["index"]] = out.get(c["index"], "") + (c["delta"].get("content") or "")
    return out


async def test_several_choices_are_replayed_and_only_what_the_client_lacks_goes_on() -> None:
    full = [role("s"), choice_token(0, "Hel", "s"), choice_token(1, "Bon", "s"),
            choice_token(0, "lo", "s", "stop"), choice_token(1, "jour", "s", "stop"),
            {"id": "s", "choices": [], "usage": {"completion_tokens": 4}}]  # fmt: skip

    def answer(k: int, sent: Sent) -> Script:
        if k == 0:
            chunks = sse(*full[:3], done=False)
            return Script(200, chunks, error=ReadError("reset"), at_chunk=len(chunks))
        return Script(200, sse(*full))

    h = Harness(2, answer, retries=FAST_RETRIES)
    got = await h.forward(stream=True, body=N2)
    chunks = got.events()[:-1]
    assert texts(chunks) == {0: "Hello", 1: "Bonjour"}
    assert h.transport.sent[1].body == N2  # the request as it was: a replay
    assert chunks[-1]["usage"]["completion_tokens"] == 4  # the replay's count: each token once
    assert len([c for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]) == 1
    h.assert_settled()


async def test_a_replay_that_differs_is_stopped_and_the_client_told() -> None:
    def answer(k: int, sent: Sent) -> Script:
        if k == 0:
            chunks = sse(choice_token(0, "Hel", "s0"), choice_token(1, "Bon", "s0"), done=False)
            return Script(200, chunks, error=ReadError("reset"), at_chunk=len(chunks))
        chunks = sse(choice_token(0, "Hal", "s1"), done=False)
        return Script(200, chunks, chunk_delay_s=0.001, hang=True)  # would run on: stopped

    h = Harness(2, answer, retries=FAST_RETRIES)
    got = await h.forward(stream=True, body=N2)
    last = got.events()[-1]
    assert last["error"]["code"] == "continuation_diverged"
    assert texts(got.events()[:-1]) == {0: "Hel", 1: "Bon"}  # nothing of the other answer
    ended = h.of(AttemptEnded)[-1]
    assert (ended.kind, ended.error) == ("continuation", "cancelled")  # not the backend's fault
    h.assert_settled()


async def test_a_stream_that_cannot_be_replayed_faithfully_is_ended_at_once() -> None:
    unseeded = msgspec.json.encode({**msgspec.json.decode(N2), "seed": None})

    def answer(k: int, sent: Sent) -> Script:
        chunks = sse(choice_token(0, "Hel", "s0"), choice_token(1, "Bon", "s0"), done=False)
        return Script(200, chunks, error=ReadError("reset"), at_chunk=len(chunks))

    h = Harness(2, answer, retries=FAST_RETRIES)
    got = await h.forward(stream=True, body=unseeded)
    error = got.events()[-1]["error"]
    assert error["code"] == "stream_not_resumable" and "seed" in error["message"]
    assert len(h.transport.sent) == 1  # no backend was asked
    h.assert_settled()


async def test_a_usage_asked_for_and_lost_with_the_break_comes_from_a_replay() -> None:
    seeded = msgspec.json.encode({**msgspec.json.decode(N2), "n": 1})
    full = [role("s"), token("Hi", "s"), token("!", "s", "stop"),
            {"id": "s", "choices": [], "usage": {"completion_tokens": 2}}]  # fmt: skip

    def answer(k: int, sent: Sent) -> Script:
        if k == 0:  # broke after the last token, before the usage
            chunks = sse(*full[:3], done=False)
            return Script(200, chunks, error=ReadError("reset"), at_chunk=len(chunks))
        return Script(200, sse(*full))

    h = Harness(2, answer, retries=FAST_RETRIES)
    got = await h.forward(stream=True, body=seeded)
    *chunks, done = got.events()
    assert done == "[DONE]" and h.transport.sent[1].body == seeded
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1]) == "Hi!"
    assert (chunks[-1]["choices"], chunks[-1]["usage"]) == ([], {"completion_tokens": 2})
    h.assert_settled()
