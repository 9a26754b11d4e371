"""One request's lifecycle as typed events, and the hooks that hand them to subscribers."""

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
]
