"""The virtual transport (simulate/transport.py): an answer as its first token and its end, and a
replica that dies mid-answer handing over what it had streamed, as a real one's socket would."""

from __future__ import annotations

import asyncio

import pytest

from fleetgate.http.client import Origin
from fleetgate.http.errors import ReadError
from fleetgate.simulate.loop import VirtualTimeLoop
from fleetgate.simulate.replica import SimBackend
from fleetgate.simulate.transport import Fleet, VirtualTransport
from fleetgate.simulate.workload import SimRequest
from fleetgate.workers.sim.profiles import get_profile

H100 = get_profile("h100-llama3-8b")
ORIGIN = Origin.parse("http://m-0.r.sim:8000")
BODY = b'{"messages":[{"role":"user","content":"x"}],"max_tokens":400,"stream":true}'


class Sink:
    def __init__(self) -> None:
        self.pending: list[bytes] = []
        self.got: list[bytes] = []

    def flush(self) -> None:
        self.got += self.pending
        self.pending.clear()


def run(main: object) -> None:
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(io=False)) as runner:
        runner.run(main)  # type: ignore[arg-type]


def test_a_replica_that_dies_mid_answer_hands_over_what_it_streamed() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        backend = SimBackend(H100, loop, 512)
        fleet = Fleet({ORIGIN: backend})
        fleet.expect(b"r1", SimRequest(0.0, 1000, 400, ()))
        answer = await VirtualTransport(fleet, loop).request(
            ORIGIN, b"POST", b"/v1/chat/completions", [(b"x-request-id", b"r1")], BODY
        )
        sink = Sink()
        relay = loop.create_task(answer.relay(sink))
        await asyncio.sleep(0.5)  # about 100 decode steps of ~4.7 ms
        backend.crash()
        with pytest.raises(ReadError):
            await relay
        _, partial = sink.got
        tokens = partial.count(b"abcd")
        assert 80 < tokens < 120  # what it had generated after the first, not all of it
        assert b'"finish_reason":null' in partial

    run(main())
