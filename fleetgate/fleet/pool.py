"""A pool: the backends that serve one model, and the routing pipeline that chooses among them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.pipeline import RoutingPipeline


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long the gateway waits on a backend of the pool (connecting: the client's own)."""

    first_byte_s: float = 180.0  # from sending the request to the answer's head; then 504
    total_s: float = 1800.0  # the whole exchange, a stream's last chunk included; then 504


class Pool:
    """Backends of one model. Tracks in-flight counts so that load-aware policies stay current.

    `candidates` is a tuple rebuilt only when health changes, so policies can keep indexes
    keyed on its identity.
    """

    __slots__ = ("_pipeline", "candidates", "model", "states", "timeouts")

    def __init__(
        self,
        model: str,
        states: Sequence[BackendState],
        pipeline: RoutingPipeline,
        timeouts: Timeouts | None = None,
    ) -> None:
        self.model = model
        self.timeouts = timeouts or Timeouts()
        self.states = tuple(states)
        self._pipeline = pipeline
        self.candidates: tuple[BackendState, ...] = ()
        self.refresh()

    def refresh(self) -> None:
        """Recompute the candidates after a health change."""
        self.candidates = tuple(s for s in self.states if s.healthy)

    @property
    def ready(self) -> bool:
        return bool(self.candidates)

    def pick(self, request: RoutingRequest, now: float) -> BackendState | None:
        if not self.candidates:
            return None
        return self._pipeline.pick(request, self.candidates, now)

    def begin(self, state: BackendState) -> None:
        """A request was sent to `state`."""
        state.in_flight += 1
        state.requests_total += 1
        self._pipeline.picker.load_changed(state)

    def end(self, state: BackendState) -> None:
        """A request to `state` finished, whatever its outcome."""
        state.in_flight -= 1
        self._pipeline.picker.load_changed(state)
