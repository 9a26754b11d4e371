"""The plugin kinds a routing pipeline is made of, and what each sees of a request.

Every plugin is synchronous and pure over fleet state: no I/O, time from the `now` it is given,
randomness from the `random.Random` it was built with. That keeps the hot path fast and lets the
fleet simulator run the same code in virtual time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fleetgate.fleet.backend import BackendState


class RoutingRequest:
    """What routing may know of a request: parsed once at the edge, never the whole body."""

    __slots__ = ("endpoint", "max_tokens", "model", "session_key", "stream")

    def __init__(
        self,
        model: str,
        endpoint: str,
        stream: bool,
        max_tokens: int | None = None,
        session_key: str | None = None,
    ) -> None:
        self.model = model
        self.endpoint = endpoint  # "chat", "completions" or "embeddings"
        self.stream = stream
        self.max_tokens = max_tokens
        self.session_key = session_key


class Filter(Protocol):
    """Drops candidates that must not serve this request (returns the input when none)."""

    def filter(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> Sequence[BackendState]: ...


class Scorer(Protocol):
    """Scores each candidate in [0, 1]; higher is better."""

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]: ...


class Picker(Protocol):
    """Chooses one candidate (a non-empty sequence), given the combined scores if any."""

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[BackendState],
        scores: Sequence[float] | None,
        now: float,
    ) -> BackendState: ...

    def load_changed(self, state: BackendState) -> None:
        """Called after a backend's in-flight count changed; indexes keep themselves current."""
