"""Who hears which events: subscribers are added in the composition root, then each emitting
component takes one emitter per event type and calls it, with nothing to look up per event.

    hooks = Hooks()
    hooks.subscribe(AttemptEnded, outliers.on_attempt_ended)
    hooks.subscribe(Event, tracer.on_event)          # a base type hears all its subtypes
    emit = Emitters(hooks)                            # after the last subscribe
    if emit.attempt_ended is not None:
        emit.attempt_ended(AttemptEnded(...))

The gateway has one set of emitters for its edge (Received, Rejected, Admitted, and the
Finished of requests it refuses) and one per pool (everything from routing on): a subscriber
that pairs edge and pool events, as metrics does, subscribes to the edge's hooks and each
pool's (the composition root, serve.py, does it).

An event type nobody subscribed to has no emitter (None): the emitting code checks, and makes
no event nobody hears (the hot path's cost stays what its subscribers cost). With one
subscriber the emitter is that subscriber itself; with several it calls them in the order
they subscribed. A subscriber that raises is a bug and is not hidden: the exception reaches
the emitting code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fleetgate.lifecycle.events import (
    Admitted,
    AttemptEnded,
    AttemptStarted,
    Continued,
    Ejected,
    Event,
    Finished,
    FirstToken,
    GpuChanged,
    Hedged,
    Received,
    Rejected,
    Retried,
    RetryRefused,
    Routed,
)

E = TypeVar("E", bound=Event)
Handler = Callable[[Any], None]


class Hooks:
    """Subscribers by event type."""

    def __init__(self) -> None:
        self._handlers: list[tuple[type[Event], Handler]] = []

    def subscribe(self, kind: type[E], handler: Callable[[E], None]) -> None:
        """Call `handler` with every event of type `kind` (subtypes included)."""
        self._handlers.append((kind, handler))

    def emitter(self, kind: type[E]) -> Callable[[E], None] | None:
        """The function that hands an event of type `kind` to its subscribers (None when it
        has none)."""
        handlers = tuple(h for k, h in self._handlers if issubclass(kind, k))
        if not handlers:
            return None
        if len(handlers) == 1:
            return handlers[0]

        def emit(event: E) -> None:
            for handler in handlers:
                handler(event)

        return emit


class Emitters:
    """One emitter per event type, made once from the hooks (subscribe first); None for a
    type nobody hears."""

    __slots__ = (
        "admitted", "attempt_ended", "attempt_started", "continued", "ejected", "finished",
        "first_token", "gpu_changed", "hedged", "received", "rejected", "retried",
        "retry_refused", "routed",
    )  # fmt: skip

    def __init__(self, hooks: Hooks) -> None:
        self.received = hooks.emitter(Received)
        self.rejected = hooks.emitter(Rejected)
        self.admitted = hooks.emitter(Admitted)
        self.routed = hooks.emitter(Routed)
        self.attempt_started = hooks.emitter(AttemptStarted)
        self.first_token = hooks.emitter(FirstToken)
        self.attempt_ended = hooks.emitter(AttemptEnded)
        self.retried = hooks.emitter(Retried)
        self.retry_refused = hooks.emitter(RetryRefused)
        self.hedged = hooks.emitter(Hedged)
        self.continued = hooks.emitter(Continued)
        self.finished = hooks.emitter(Finished)
        self.ejected = hooks.emitter(Ejected)
        self.gpu_changed = hooks.emitter(GpuChanged)
