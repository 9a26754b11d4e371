"""The Director runs a request's whole lifecycle with no HTTP object anywhere: a parsed
InferenceRequest in, its answer written to a Sink, its upstream a scripted transport
(http/mock.py), every event recorded; refusals answered in OpenAI's shape."""

from __future__ import annotations

import time

import msgspec

from fleetgate.clock import LoopClock
from fleetgate.config import parse_config
from fleetgate.director import Director, InferenceRequest
from fleetgate.fleet.backend import Backend
from fleetgate.http.mock import MockTransport, Script, Sent
from fleetgate.lifecycle.downstream import Sink
from fleetgate.lifecycle.events import Admitted, Event, Finished, Received, Rejected, Routed
from fleetgate.routing.base import RoutingRequest
from fleetgate.traffic.door import ANONYMOUS_CALLER
from tests.director.build import director_over

ANSWER = (
    b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    b'"finish_reason":"length","message":{"role":"assistant","content":"hello"}}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
)
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'


def director(events: list[Event], sent: list[Sent]) -> Director:
    config = parse_config(
        {"pools": [{"model": "m", "backends": [{"url": "http://10.0.0.1:8000"}]}]}
    )

    def answer(request: Sent) -> Script:
        sent.append(request)
        return Script(200, chunks=[ANSWER], headers=[(b"content-type", b"application/json")])

    clock = LoopClock()
    backend = Backend("b0", "http://10.0.0.1:8000", ("m",))
    return director_over(config.pools[0], [backend], MockTransport(answer, clock), clock, events)


def request(model: str = "m") -> InferenceRequest:
    routing = RoutingRequest(model, "chat", False, 2, prompt=b'[{"content":"hi"}]')
    return InferenceRequest(
        request_id=b"r1", started=time.monotonic(), path=b"/v1/chat/completions",
        routing=routing, body=BODY, caller=ANONYMOUS_CALLER,
    )  # fmt: skip


async def test_a_request_runs_from_received_to_finished_into_a_sink() -> None:
    events: list[Event] = []
    sent: list[Sent] = []
    run = director(events, sent)
    sink = Sink()
    run.received(b"r1", time.monotonic(), b"/v1/chat/completions")
    await run.run(request(), sink)
    assert (sink.status, sink.body) == (200, ANSWER)
    assert sink.header(b"x-request-id") == b"r1"
    assert [s.path for s in sent] == [b"/v1/chat/completions"]
    assert sent[0].body == BODY
    kinds = [type(e) for e in events]
    assert kinds[0] is Received and Admitted in kinds and Routed in kinds
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert (finished.status, finished.backend, finished.outcome) == (200, "b0", "answered")


async def test_a_model_it_does_not_serve_is_refused_in_openais_shape() -> None:
    events: list[Event] = []
    sent: list[Sent] = []
    run = director(events, sent)
    sink = Sink()
    await run.run(request("gpt-9"), sink)
    assert sink.status == 404 and not sent
    error = msgspec.json.decode(sink.body)["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert "'gpt-9' does not exist here; known models: m." in error["message"]
    rejected, finished = events
    assert isinstance(rejected, Rejected) and rejected.reason == "model_not_found"
    assert isinstance(finished, Finished) and finished.model == ""  # never the client's string
