"""Admission and shedding through the real Director, in virtual time (tests/virtual_time.py):
a pool that serves two requests at once, upstreams that answer after a second of virtual time,
and requests that queue for a place, get one as others end, or are refused at their queue
deadline (or at once, when the queue's drain rate says they would wait past it). Each test
says when, to the virtual instant, and takes milliseconds of real time."""

from __future__ import annotations

import asyncio

import msgspec

from fleetgate.clock import LoopClock
from fleetgate.config import parse_config
from fleetgate.director import InferenceRequest
from fleetgate.director.request import QUEUE_TIMEOUT_HEADER
from fleetgate.fleet.backend import Backend
from fleetgate.http.mock import MockTransport, Script, Sent
from fleetgate.lifecycle.downstream import Sink
from fleetgate.lifecycle.events import Admitted, Event, Finished, Rejected
from fleetgate.routing.base import RoutingRequest
from fleetgate.traffic.door import ANONYMOUS_CALLER
from tests.director.build import director_over
from tests.director.test_director import ANSWER, BODY
from tests.virtual_time import in_virtual_time

LATENCY_S = 1.0  # every answer comes this long after its request was sent


class Gateway:
    """The Director over one pool of two backends that serves `max_in_flight` requests at
    once (its admission queue holds the rest), on `clock`; every event recorded."""

    def __init__(self, clock: LoopClock, max_in_flight: int = 2, max_queue: int = 16) -> None:
        self.clock = clock
        self.events: list[Event] = []
        urls = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
        config = parse_config({"pools": [{
            "model": "m", "backends": [{"url": u} for u in urls],
            "admission": {"limit": {"max_in_flight": max_in_flight}, "max_queue": max_queue},
        }]})  # fmt: skip

        def answer(sent: Sent) -> Script:
            return Script(200, [ANSWER], [(b"content-type", b"application/json")],
                          head_delay_s=LATENCY_S)  # fmt: skip

        backends = [Backend(f"b{i}", u, ("m",)) for i, u in enumerate(urls)]
        transport = MockTransport(answer, clock)
        self.director = director_over(config.pools[0], backends, transport, clock, self.events)

    def send(self, name: str, queue_timeout_s: float) -> tuple[asyncio.Task[None], Sink]:
        """Request `name`, arriving now, that waits at most `queue_timeout_s` for a place."""
        routing = RoutingRequest("m", "chat", False, 2, prompt=b'[{"content":"hi"}]')
        request = InferenceRequest(
            request_id=name.encode(), started=self.clock.now(), path=b"/v1/chat/completions",
            routing=routing, body=BODY, caller=ANONYMOUS_CALLER,
            metadata={QUEUE_TIMEOUT_HEADER: str(queue_timeout_s).encode()},
        )  # fmt: skip
        sink = Sink()
        return asyncio.ensure_future(self.director.run(request, sink)), sink

    def of(self, kind: type[Event], name: str) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind) and e.request_id == name.encode()]

    def finished(self, name: str) -> Finished:
        (done,) = self.of(Finished, name)
        assert isinstance(done, Finished)
        return done


@in_virtual_time
async def test_queued_requests_get_places_as_others_end_or_are_refused_at_their_deadline(
    clock: LoopClock,
) -> None:
    gw = Gateway(clock)
    sent = {name: gw.send(name, wait_s) for name, wait_s in
            [("a", 5.0), ("b", 5.0), ("c", 5.0), ("d", 0.5), ("e", 5.0)]}  # fmt: skip
    await asyncio.gather(*(task for task, _ in sent.values()))

    # a and b went at once; c and e waited for their places, which a and b gave back at 1 s.
    for name, admitted_at, done_at in [("a", 0, 1), ("b", 0, 1), ("c", 1, 2), ("e", 1, 2)]:
        (admitted,) = gw.of(Admitted, name)
        assert isinstance(admitted, Admitted)
        assert (admitted.at, admitted.queued_s) == (admitted_at, admitted_at)
        assert sent[name][1].status == 200
        assert gw.finished(name).at == done_at
    # d would wait half a second at most: refused at its deadline, before any place opened.
    sink = sent["d"][1]
    assert sink.status == 503 and sink.header(b"retry-after") is not None
    error = msgspec.json.decode(sink.body)["error"]
    assert error["code"] == "queue_timeout" and "within 0.5 s" in error["message"]
    (rejected,) = gw.of(Rejected, "d")
    assert isinstance(rejected, Rejected)
    assert (rejected.at, rejected.status, rejected.reason) == (0.5, 503, "queue_timeout")
    assert (gw.finished("d").at, gw.finished("d").outcome) == (0.5, "rejected")
    assert gw.of(Admitted, "d") == []
    assert clock.now() == 2.0  # the whole scenario: two virtual seconds


@in_virtual_time
async def test_a_request_the_drain_rate_says_would_wait_too_long_is_refused_at_once(
    clock: LoopClock,
) -> None:
    gw = Gateway(clock)
    first = [gw.send(name, 5.0) for name in ("a", "b", "c", "d")]
    await clock.sleep(1.5)  # a and b ended at 1 s (a drain of about one a second); c, d run
    late, sink = gw.send("late", 0.2)
    await asyncio.gather(late, *(task for task, _ in first))
    # Its place would come as c or d ends: at about one a second, about a second's wait,
    # longer than its 0.2 s. Refused as it came, not 0.2 s later.
    assert sink.status == 503
    assert "would wait about 1 s" in msgspec.json.decode(sink.body)["error"]["message"]
    (rejected,) = gw.of(Rejected, "late")
    assert isinstance(rejected, Rejected) and rejected.at == 1.5
    assert gw.finished("c").at == gw.finished("d").at == 2.0


@in_virtual_time
async def test_a_request_that_finds_the_queue_full_is_refused_at_once(clock: LoopClock) -> None:
    gw = Gateway(clock, max_queue=2)
    sent = [gw.send(name, 10.0) for name in ("a", "b", "c", "d")]  # two in flight, two queued
    await clock.sleep(0.25)
    full, sink = gw.send("full", 10.0)
    await asyncio.gather(full, *(task for task, _ in sent))
    assert sink.status == 503
    assert "queue of this model is full (2 waiting)" in sink.body.decode()
    assert (gw.finished("full").at, gw.finished("full").outcome) == (0.25, "rejected")
    assert [gw.finished(n).at for n in "abcd"] == [1.0, 1.0, 2.0, 2.0]  # the queued ones ran
