"""The model endpoints at the edge: an HTTP request to one is parsed (gateway/requests.py), its
caller found by its API key (traffic/door.py), and handed to the Director as an
InferenceRequest, with the server's writer as its downstream. What cannot get that far (a bad
body or key) the Director answers as a refusal."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from fleetgate.director.director import Director
from fleetgate.director.request import LANE_HEADER, InferenceRequest
from fleetgate.gateway.requests import (
    bad_request,
    is_form,
    parse_chat,
    parse_completion,
    parse_embedding,
    parse_passthrough,
    parse_responses,
)
from fleetgate.http.forwarding import RequestHeaders
from fleetgate.http.server import Request
from fleetgate.lifecycle.downstream import Downstream
from fleetgate.openai_api import JSON
from fleetgate.routing.base import RoutingRequest
from fleetgate.traffic.door import ANONYMOUS_CALLER, Caller, FrontDoor, Refused

_Parser = Callable[[bytes, dict[bytes, bytes]], RoutingRequest]
_BATCH_LANE = {LANE_HEADER: b"batch"}  # a batch request's metadata
_BATCH_HEADERS = {b"content-type": JSON, **_BATCH_LANE}  # what its parser reads

# The model endpoints a batch's requests may go to as well (`serve_as`).
BATCHABLE: Mapping[bytes, _Parser] = {
    b"/v1/chat/completions": parse_chat,
    b"/v1/completions": parse_completion,
    b"/v1/embeddings": parse_embedding,
    b"/v1/responses": parse_responses,
}


class Endpoint(Protocol):
    async def __call__(self, request: Request, writer: Downstream, request_id: bytes) -> None: ...


class InferenceEndpoints:
    """The handlers of the model endpoints (and of the configured pass-through paths)."""

    def __init__(
        self,
        director: Director,
        clock: Callable[[], float],
        new_id: Callable[[], bytes],
        *,
        door: FrontDoor | None = None,
        forward: RequestHeaders | None = None,
        passthrough: Sequence[str] = (),
    ) -> None:
        self._director = director
        self._clock = clock
        self._new_id = new_id  # request ids of the batch runner's requests
        self._door = door  # None: auth off and no limits, no caller to find
        self._forward = forward or RequestHeaders()  # which of a client's headers go upstream
        self._parsers: dict[bytes, _Parser] = dict(BATCHABLE)
        for other in passthrough:  # other model paths, routed by their `model`
            self._parsers[other.encode()] = parse_passthrough

    @property
    def director(self) -> Director:
        """The lifecycle these endpoints run each request through."""
        return self._director

    @property
    def door(self) -> FrontDoor | None:
        """Who the callers are (None: auth off and no limits)."""
        return self._door

    def routes(self) -> dict[bytes, Endpoint]:
        """POST handlers by path."""
        return {path: self._endpoint(parse) for path, parse in self._parsers.items()}

    def _endpoint(self, parse: _Parser) -> Endpoint:
        async def handle(request: Request, writer: Downstream, request_id: bytes) -> None:
            started = self._clock()
            director = self._director
            director.received(
                request_id, started, request.path, request.headers.get(b"traceparent")
            )
            caller = ANONYMOUS_CALLER
            try:
                if self._door is not None:
                    caller = self._door.identify(request.headers)
                inference = self._inference(request, parse, request_id, started, caller)
            except Refused as exc:
                director.refuse(writer, request_id=request_id, started=started, refusal=exc,
                                caller=caller)  # fmt: skip
                return
            except Exception:
                director.failed_here(request_id, started)  # the server answers its 500
                raise
            await director.run(inference, writer)

        return handle

    def _inference(
        self,
        request: Request,
        parse: _Parser,
        request_id: bytes,
        started: float,
        caller: Caller,
    ) -> InferenceRequest:
        if request.body_too_large:
            raise bad_request(
                "The request body is larger than this gateway accepts; send a smaller one.",
                status=413, code="request_too_large",
            )  # fmt: skip
        headers = request.headers
        routing = parse(request.body, headers)
        upload = routing.endpoint == "other" and is_form(headers)
        forwarded, metadata = self._forward.split(headers)
        return InferenceRequest(
            request_id=request_id, started=started, path=request.path, routing=routing,
            body=request.body, caller=caller,
            content_type=headers[b"content-type"] if upload else JSON, upload=upload,
            metadata=metadata, forwarded=forwarded,
            cache_control=headers.get(b"cache-control", b""),
        )  # fmt: skip

    async def serve_as(self, caller: Caller, path: bytes, body: bytes, writer: Downstream) -> None:
        """`body` as a request to the model endpoint `path`, made by `caller` in this process
        and on the batch lane: the batch runner's way in (batches/runner.py). It goes the way
        a client's request goes (the caller's limits, admission, routing, retries, events);
        its answer is written to `writer` (a lifecycle/downstream.py Sink)."""
        request_id, started = self._new_id(), self._clock()
        director = self._director
        director.received(request_id, started, path)
        try:
            routing = self._parsers[path](body, _BATCH_HEADERS)
        except Refused as exc:
            director.refuse(writer, request_id=request_id, started=started, refusal=exc,
                            caller=caller)  # fmt: skip
            return
        inference = InferenceRequest(
            request_id=request_id, started=started, path=path, routing=routing, body=body,
            caller=caller, metadata=_BATCH_LANE,
        )  # fmt: skip
        await director.run(inference, writer)
