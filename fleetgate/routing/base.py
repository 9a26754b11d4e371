"""The plugin kinds a routing pipeline is made of, and what each sees of a request.

Every plugin is synchronous and pure over fleet state: no I/O, time from the `now` it is given,
randomness from the `random.Random` it was built with. That keeps the hot path fast and lets the
fleet simulator run the same code in virtual time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from fleetgate.fleet.backend import BackendState

BYTES_PER_TOKEN = 4  # the estimate of prompt tokens before any tokenizer has seen the prompt


class RoutingRequest:
    """What routing may know of a request: parsed once at the edge, never the whole body.

    `prompt` is the prompt as the client sent it: the raw JSON of each of the `messages`,
    joined by commas (one copy of those bytes; `[` + it + `]` is the array again), or the
    completion's `prompt` encoded. Its length in bytes / 4 is the
    prompt-token estimate routing uses; prefix routing hashes its blocks.
    """

    __slots__ = (
        "endpoint", "follows", "max_tokens", "model", "pinned", "prompt", "prompt_tokens",
        "regions", "session_key", "stays", "stream",
    )  # fmt: skip

    def __init__(
        self,
        model: str,
        endpoint: str,
        stream: bool,
        max_tokens: int | None = None,
        session_key: str | None = None,
        prompt: bytes | memoryview = b"",
        follows: str | None = None,
    ) -> None:
        self.model = model
        # "chat", "completions", "embeddings", "responses", or "other" (a pass-through path)
        self.endpoint = endpoint
        self.stream = stream
        self.max_tokens = max_tokens
        self.session_key = session_key
        self.prompt = prompt  # never changed after: `prompt_tokens` is made of it once
        # Estimated prompt tokens: bytes / 4, at least 1 (read many times a request).
        self.prompt_tokens = len(prompt) // BYTES_PER_TOKEN or 1
        self.follows = follows  # the stored response it continues (`previous_response_id`)
        # The backend it must go to while that one can take it: the one holding `follows`.
        self.pinned: str | None = None
        # Data residency: the only regions (a backend's `region` label) any attempt of it may
        # go to, its tenant's (traffic/tenants.py); None: any.
        self.regions: frozenset[str] | None = None
        # Never spilled out of the gateway's region when it is saturated (its tenant's
        # `spill: false`): it waits there instead (routing/regions.py).
        self.stays = False


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


@runtime_checkable
class LoadTracker(Protocol):
    """A picker that keeps an index over in-flight counts or weights (a heap): told after
    every change to a backend's, so the index keeps itself current."""

    def load_changed(self, state: BackendState) -> None: ...


@runtime_checkable
class Learner(Protocol):
    """A scorer that learns from each decision (where a prompt went, a session's home)."""

    def chosen(self, request: RoutingRequest, state: BackendState, now: float) -> None: ...


@runtime_checkable
class Nominator(Protocol):
    """A scorer (or filter) that can name the few backends it would score highest (or keep),
    by id, without a scan, so a shortlist of a large pool includes them (those that are not
    candidates are passed over)."""

    def nominate(self, request: RoutingRequest, now: float) -> list[str]: ...


@runtime_checkable
class Roster(Protocol):
    """A scorer (or filter) that keeps state over the whole candidate set (a hash ring, the
    pool's fast backends): told the set whenever it changes, since with a shortlist it only
    ever sees a part of it."""

    def roster(self, candidates: Sequence[BackendState]) -> None: ...


@runtime_checkable
class Watcher(Protocol):
    """A filter that judges its pool as a whole (locality: is the gateway's region up,
    saturated?) whatever part of it one pick is given (a residency subset, a retry's
    untried backends): given, once, where to read the pool's members of the moment and its
    candidates (a new tuple whenever a member's health changes)."""

    def watch(
        self,
        members: Callable[[], Sequence[BackendState]],
        candidates: Callable[[], Sequence[BackendState]],
    ) -> None: ...
