"""One simulated replica on the virtual clock: its engine model (simulate/engine.py), stepped
from event to event by a timer of the loop's, and whether it is up. The transport
(simulate/transport.py) submits the gateway's requests to it and waits on each `Flight`'s first
token and end; a crash resets every connection, handing over what each stream had so far."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from fleetgate.http.errors import ReadError
from fleetgate.simulate.engine import FleetEngine, Job, slowed
from fleetgate.workers.sim.profiles import EngineProfile


@dataclass(slots=True)
class Flight:
    """One attempt on one engine: resolved at its first token and at its end."""

    job: Job
    first: asyncio.Future[float]
    end: asyncio.Future[float]
    said: int = 0  # tokens streamed when the replica died (what a continuation goes on from)


class SimBackend:
    """One replica: its engine, stepped on the loop's virtual clock, and whether it is up."""

    def __init__(self, profile: EngineProfile, loop: asyncio.AbstractEventLoop,
                 block_tokens: int, region: str = "") -> None:  # fmt: skip
        self.engine = FleetEngine(profile, block_tokens)
        self.region = region
        self.profile = profile  # its own speed (the engine's may be slowed down)
        self.up = True
        self._loop = loop
        self._flights: dict[int, Flight] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._due = math.inf

    def submit(self, job: Job) -> Flight:
        """`job` reaches the engine now."""
        loop = self._loop
        self._run(loop.time())
        flight = Flight(job, loop.create_future(), loop.create_future())
        self._flights[job.key] = flight
        self.engine.add(job, loop.time())
        self._schedule()
        return flight

    def abort(self, flight: Flight) -> None:
        """The gateway gave up on `flight` (a timeout, a hedge that lost)."""
        if self._flights.pop(flight.job.key, None) is not None:
            self._run(self._loop.time())
            self.engine.abort(flight.job.key)
            self._schedule()

    def crash(self) -> None:
        """The replica dies: every connection to it is reset, and it refuses new ones."""
        self.up = False
        self._run(self._loop.time())
        for key, flight in self._flights.items():
            flight.said = self.engine.generated(key)
        self.engine.crash()
        flights, self._flights = self._flights, {}
        for flight in flights.values():  # each fails where its attempt waits (if it still does)
            first, end = flight.first, flight.end
            if not first.done():
                first.set_exception(ReadError("connection reset by the backend"))
            elif not first.cancelled() and first.exception() is None and not end.done():
                end.set_exception(ReadError("connection reset by the backend"))
        self._schedule()

    def restart(self) -> None:
        """Back up, empty (its cache cold)."""
        self.up = True

    def slow_down(self, factor: float) -> None:
        """From now on every step takes `factor` times its own time (1: its own again)."""
        self._run(self._loop.time())
        self.engine.profile = slowed(self.profile, factor)
        self._schedule()

    def _run(self, now: float) -> None:
        firsts, ends = self.engine.advance(now)
        flights = self._flights
        for job, at in firsts:  # (a deadline may have failed the flight this very instant)
            flight = flights.get(job.key)
            if flight is not None and not flight.first.done():
                flight.first.set_result(at)
        for job, at in ends:
            flight = flights.pop(job.key, None)
            if flight is not None and not flight.end.done():
                flight.end.set_result(at)

    def _schedule(self) -> None:
        due = self.engine.next_event_at()
        if due == self._due:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._due = due
        self._timer = None if math.isinf(due) else self._loop.call_at(due, self._fire)

    def _fire(self) -> None:
        due, self._due, self._timer = self._due, math.inf, None
        # The loop's clock lands on a timer's time give or take a rounding.
        self._run(max(self._loop.time(), due))
        self._schedule()
