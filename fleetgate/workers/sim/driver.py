"""Drives the pure engine with a wall clock: step, wait as long as the GPU would, publish.

The engine keeps its own timeline (`t`, the end of the last step) and each wait targets that
absolute time, so timer granularity (uvloop's is a millisecond) jitters single tokens but never
accumulates into a slower engine: a step that starts up to CATCH_UP_S late keeps the timeline,
and its wait is that much shorter. Only when Python falls further behind does the timeline
move to the wall clock's now; the time lost so (the sim was slower than the GPU it models) is
reported to the step observer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from fleetgate.workers.sim.engine import Engine, EngineRequest, FinishedRequest

CATCH_UP_S = 0.005  # a step this late is caught up by the next waits; later, time is lost


class TokenSink(Protocol):
    """Where one request's output goes as the engine produces it."""

    def token(self) -> None:
        """One more output token is visible now."""

    def finished(self, info: FinishedRequest) -> None:
        """The last token was published; no more calls follow."""


class StepObserver(Protocol):
    """Told of every engine step once its tokens are published."""

    def step(self, tokens: int, decodes: int, gap_s: float, lost_s: float) -> None:
        """The step computed `tokens`; `decodes` requests got a token `gap_s` after their last
        one (the wall time since the previous step's tokens were published); it started
        `lost_s` later than the modelled GPU's timeline allowed (Python fell behind)."""


class WallClockDriver:
    """Runs `engine` in real time until cancelled."""

    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], float],
        slowdown: Callable[[], float],
        observer: StepObserver | None = None,
    ) -> None:
        self.engine = engine
        self._clock = clock
        self._slowdown = slowdown
        self._observer = observer
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
        clock, engine, sinks, observer = self._clock, self.engine, self._sinks, self._observer
        t = published = clock()
        while True:
            if not engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                t = published = clock()
            now = clock()
            lost = 0.0
            if now > t + CATCH_UP_S:
                lost, t = now - t, now
            result = engine.step(t)
            t += result.duration_s * self._slowdown()
            # Always yield, even when behind: the same loop serves this worker's HTTP.
            await asyncio.sleep(max(0.0, t - clock()))
            if observer is not None and result.tokens:
                now = clock()
                decodes = len(result.emitted) - result.first_tokens
                observer.step(result.tokens, decodes, now - published, lost)
                published = now
            for request_id in result.emitted:
                sink = sinks.get(request_id)
                if sink is not None:
                    sink.token()
            for info in result.finished:
                done = sinks.pop(info.request_id, None)
                if done is not None:
                    done.finished(info)
