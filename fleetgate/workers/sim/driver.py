"""Drives the pure engine with a wall clock: step, wait as long as the GPU would, publish.

The engine keeps its own timeline (`t`, the end of the last step) and each wait targets that
absolute time, so timer granularity (uvloop's is a millisecond) jitters single tokens but never
accumulates into a slower engine. If Python falls behind, the next step starts at the wall
clock's now instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from fleetgate.workers.sim.engine import Engine, EngineRequest, FinishedRequest


class TokenSink(Protocol):
    """Where one request's output goes as the engine produces it."""

    def token(self) -> None:
        """One more output token is visible now."""

    def finished(self, info: FinishedRequest) -> None:
        """The last token was published; no more calls follow."""


class WallClockDriver:
    """Runs `engine` in real time until cancelled."""

    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], float],
        slowdown: Callable[[], float],
    ) -> None:
        self.engine = engine
        self._clock = clock
        self._slowdown = slowdown
        self._sinks: dict[str, TokenSink] = {}
        self._wake = asyncio.Event()

    def submit(self, request: EngineRequest, sink: TokenSink) -> None:
        """Queue `request`; raises ValueError (from the engine) if it can never run."""
        self.engine.add_request(request)
        self._sinks[request.request_id] = sink
        self._wake.set()

    async def wait(self, gpu_s: float) -> None:
        """Let `gpu_s` of the modelled hardware's time pass (dilated like every step), as for a
        transfer that runs beside the engine's steps."""
        await asyncio.sleep(gpu_s * self._slowdown())

    def abort(self, request_id: str) -> None:
        if self._sinks.pop(request_id, None) is not None:
            self.engine.abort(request_id)

    async def run(self) -> None:
        clock, engine, sinks = self._clock, self.engine, self._sinks
        t = clock()
        while True:
            if not engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                t = clock()
            now = clock()
            if now > t:
                t = now
            result = engine.step(t)
            t += result.duration_s * self._slowdown()
            # Always yield, even when behind: the same loop serves this worker's HTTP.
            await asyncio.sleep(max(0.0, t - clock()))
            for request_id in result.emitted:
                sink = sinks.get(request_id)
                if sink is not None:
                    sink.token()
            for info in result.finished:
                done = sinks.pop(info.request_id, None)
                if done is not None:
                    done.finished(info)
