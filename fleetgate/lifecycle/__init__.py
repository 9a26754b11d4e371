"""One request's lifecycle as typed events, the hooks that hand them to subscribers, and what
it writes its answer to (a downstream)."""

from fleetgate.lifecycle.downstream import Downstream, Sink
from fleetgate.lifecycle.events import (
    Admitted,
    AttemptEnded,
    AttemptStarted,
    Continued,
    Event,
    Finished,
    FirstToken,
    Hedged,
    Received,
    Rejected,
    Retried,
    RetryRefused,
    Routed,
)
from fleetgate.lifecycle.hooks import Emitters, Hooks

__all__ = [
    "Admitted",
    "AttemptEnded",
    "AttemptStarted",
    "Continued",
    "Downstream",
    "Emitters",
    "Event",
    "Finished",
    "FirstToken",
    "Hedged",
    "Hooks",
    "Received",
    "Rejected",
    "Retried",
    "RetryRefused",
    "Routed",
    "Sink",
]
