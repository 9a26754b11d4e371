"""The response cache (director/cache.py): which requests it keeps and under what key, its
bounds, and, through the real Director over a scripted upstream in virtual time, a repeated
request answered from it, identical requests in flight sent once, one tenant never given
another's answer, Cache-Control honoured, and a kept answer replayed as a stream."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from fleetgate.clock import LoopClock
from fleetgate.config import parse_config
from fleetgate.director import InferenceRequest
from fleetgate.director.cache import CacheSettings, ResponseCache, cache_key, directives
from fleetgate.director.replay import as_stream
from fleetgate.fleet.backend import Backend
from fleetgate.http.mock import MockTransport, Script, Sent
from fleetgate.lifecycle.downstream import Sink
from fleetgate.lifecycle.events import Event, Finished
from fleetgate.routing.base import RoutingRequest
from fleetgate.traffic.door import ANONYMOUS_CALLER, Caller
from fleetgate.traffic.tenants import Tenant, TenantSettings
from tests.director.build import director_over
from tests.director.test_director import ANSWER
from tests.virtual_time import in_virtual_time

FIXED = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0}'


def key(body: bytes, tenant: str = "t", model: str = "m", endpoint: str = "chat") -> bytes | None:
    return cache_key(tenant, model, endpoint, body)


def test_only_requests_that_fix_their_answer_are_kept() -> None:
    assert key(FIXED) is not None
    assert key(b'{"model":"m","messages":[],"seed":7,"temperature":0.9}') is not None
    assert key(b'{"model":"m","messages":[],"temperature":0.7}') is None
    assert key(b'{"model":"m","messages":[]}') is None  # the engine's default temperature
    assert key(FIXED, endpoint="embeddings") is None
    assert key(FIXED, endpoint="responses") is None
    assert key(b"[1, 2]") is None and key(b"not json") is None


def test_its_key_is_the_tenant_pool_and_every_parameter_but_how_it_is_sent() -> None:
    streamed = b'{"temperature":0,"stream":true,"stream_options":{"include_usage":true},' + (
        b'"messages":[{"content":"hi","role":"user"}],"model":"m"}'
    )
    assert key(streamed) == key(FIXED)  # the same question, keys in another order
    assert key(FIXED, tenant="u") != key(FIXED)
    assert key(FIXED, model="n") != key(FIXED)
    assert key(FIXED.replace(b"}", b',"max_tokens":5}', 1)) != key(FIXED)
    # Parts that run into each other make other keys: ("ab", "c") is not ("a", "bc").
    assert key(FIXED, tenant="ab", model="c") != key(FIXED, tenant="a", model="bc")


def test_cache_control_says_what_the_cache_may_do() -> None:
    assert directives(b"") == (True, True)
    assert directives(b"no-cache") == (True, False)
    assert directives(b"max-age=0, No-Store") == (False, False)


async def test_it_keeps_answers_for_their_ttl_within_its_bounds() -> None:
    clock = LoopClock()
    cache = ResponseCache(CacheSettings(enabled=True, ttl_s=10, max_entries=2, max_bytes=10),
                          clock)  # fmt: skip
    cache.keep(b"a", [], b"aaaa")
    cache.keep(b"b", [], b"bbbb")
    assert cache.get(b"a") is not None  # now the most recently used
    cache.keep(b"c", [], b"cccc")  # 12 bytes over 10: the least recently used goes
    assert cache.get(b"b") is None and cache.get(b"a") is not None and len(cache) == 2
    cache.keep(b"big", [], b"x" * 11)  # alone over the bound: never kept
    assert cache.get(b"big") is None
    kept = cache.get(b"c")
    assert kept is not None
    cache._clock = lambda: kept.kept_at + 10  # type: ignore[method-assign]
    assert cache.get(b"c") is None  # its time is up


class Gateway:
    """The Director with a response cache, over one pool whose upstream answers after a
    second of virtual time; `sent` is what reached it."""

    def __init__(self, clock: LoopClock, stream_answer: bool = False) -> None:
        self.clock = clock
        self.events: list[Event] = []
        self.sent: list[Sent] = []
        config = parse_config(
            {"pools": [{"model": "m", "backends": [{"url": "http://10.0.0.1:8000"}]}]}
        )

        def answer(sent: Sent) -> Script:
            self.sent.append(sent)
            return Script(200, [ANSWER], [(b"content-type", b"application/json")],
                          head_delay_s=1.0)  # fmt: skip

        backend = Backend("b0", "http://10.0.0.1:8000", ("m",))
        self.cache = ResponseCache(CacheSettings(enabled=True, coalesce_timeout_s=5), clock)
        self.director = director_over(config.pools[0], [backend], MockTransport(answer, clock),
                                      clock, self.events, cache=self.cache)  # fmt: skip

    async def ask(self, body: bytes = FIXED, caller: Caller = ANONYMOUS_CALLER,
                  stream: bool = False, cache_control: bytes = b"") -> Sink:  # fmt: skip
        routing = RoutingRequest("m", "chat", stream, None, prompt=b'[{"content":"hi"}]')
        request = InferenceRequest(
            request_id=b"r", started=self.clock.now(), path=b"/v1/chat/completions",
            routing=routing, body=body, caller=caller, cache_control=cache_control,
        )  # fmt: skip
        sink = Sink()
        await self.director.run(request, sink)
        return sink

    def results(self) -> list[str]:
        return [e.cache for e in self.events if isinstance(e, Finished)]


@in_virtual_time
async def test_a_repeated_request_is_answered_from_the_cache_at_once(clock: LoopClock) -> None:
    gateway = Gateway(clock)
    first = await gateway.ask()
    assert first.header(b"x-fleetgate-cache") == b"miss" and clock.now() == pytest.approx(1.0)
    again = await gateway.ask()
    assert clock.now() == pytest.approx(1.0)  # no upstream wait
    assert (again.status, again.body) == (200, ANSWER)
    assert again.header(b"x-fleetgate-cache") == b"hit"
    assert again.header(b"content-type") == b"application/json"
    assert len(gateway.sent) == 1 and gateway.results() == ["miss", "hit"]
    finished = gateway.events[-1]
    assert isinstance(finished, Finished) and (finished.status, finished.backend) == (200, "none")


@in_virtual_time
async def test_identical_requests_in_flight_reach_the_backend_once(clock: LoopClock) -> None:
    gateway = Gateway(clock)
    sinks = await asyncio.gather(*(gateway.ask() for _ in range(20)))
    assert len(gateway.sent) == 1
    assert all(s.body == ANSWER for s in sinks)
    assert sorted(gateway.results()) == ["coalesced"] * 19 + ["miss"]
    assert clock.now() == pytest.approx(1.0)


@in_virtual_time
async def test_one_tenant_is_never_given_anothers_answer(clock: LoopClock) -> None:
    gateway = Gateway(clock)
    other = Caller(Tenant.of(TenantSettings(name="other")), "k1")
    await gateway.ask()
    theirs = await gateway.ask(caller=other)
    assert theirs.header(b"x-fleetgate-cache") == b"miss" and len(gateway.sent) == 2


@in_virtual_time
async def test_cache_control_no_cache_and_no_store(clock: LoopClock) -> None:
    gateway = Gateway(clock)
    await gateway.ask(cache_control=b"no-store")  # neither looked up nor kept
    assert len(gateway.cache) == 0
    await gateway.ask()
    fresh = await gateway.ask(cache_control=b"no-cache")  # asked again, and kept
    assert fresh.header(b"x-fleetgate-cache") == b"miss" and len(gateway.sent) == 3
    assert (await gateway.ask()).header(b"x-fleetgate-cache") == b"hit"


@in_virtual_time
async def test_a_kept_answer_is_replayed_as_a_stream(clock: LoopClock) -> None:
    gateway = Gateway(clock)
    await gateway.ask()
    body = FIXED[:-1] + b',"stream":true,"stream_options":{"include_usage":true}}'
    streamed = await gateway.ask(body, stream=True)
    assert streamed.header(b"content-type") == b"text/event-stream"
    assert streamed.header(b"x-fleetgate-cache") == b"hit" and len(gateway.sent) == 1
    events = [e[6:] for e in streamed.body.decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [msgspec.json.decode(e) for e in events[:-1]]
    assert (
        "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        == "hello"
    )
    assert chunks[1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 2


def test_a_completion_replays_its_text() -> None:
    body = (b'{"id":"x","object":"text_completion","created":1,"model":"m","choices":'
            b'[{"index":0,"text":"abc","finish_reason":"stop"}]}')  # fmt: skip
    events = as_stream("completions", body, include_usage=True)  # no usage: nothing to add
    first = msgspec.json.decode(events[0][6:])
    assert (first["object"], first["choices"][0]["text"]) == ("text_completion", "abc")
    assert len(events) == 3 and events[-1] == b"data: [DONE]\n\n"
