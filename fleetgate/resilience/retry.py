"""When and how a failed attempt is tried again, before the client has seen any byte.

Retried: a connection that failed or closed before an answer, a broken or timed-out answer
head, and 429/500/502/503/504 from a backend; never a 4xx the request caused, and never once a
stream has begun (that is continuation's job). A retry goes to a backend not tried yet for
this request, after a backoff with full jitter:
    wait = U(0, min(backoff_max_s, backoff_base_s * 2 ** (retry - 1)))
and only while the pool's retry budget allows: retries in flight stay below
    max(budget_min, budget_ratio * requests in flight)
so that retries cannot multiply the load on a fleet that is already failing.
"""

from __future__ import annotations

import math
import random

from fleetgate.settings import Settings, at_least, ordered, within

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


class RetrySettings(Settings, frozen=True):
    """A pool's `retries:` section."""

    max_attempts: int = 3  # the first try included; 1 disables retries
    backoff_base_s: float = 0.025  # the first retry waits up to this
    backoff_max_s: float = 0.25  # no retry waits longer
    budget_ratio: float = 0.2  # retries in flight at most this share of requests in flight
    budget_min: int = 3  # ...but this many are always allowed

    def __post_init__(self) -> None:
        at_least("max_attempts", self.max_attempts, 1)
        within("backoff_base_s", self.backoff_base_s, 0, math.inf)
        ordered("backoff_base_s", self.backoff_base_s, "backoff_max_s", self.backoff_max_s)
        at_least("budget_ratio", self.budget_ratio, 0)
        at_least("budget_min", self.budget_min, 0)


def backoff_s(settings: RetrySettings, retry: int, rng: random.Random) -> float:
    """The wait before retry number `retry` (1 for the first retry)."""
    ceiling = min(settings.backoff_max_s, settings.backoff_base_s * 2 ** (retry - 1))
    return rng.uniform(0.0, ceiling)


class RetryBudget:
    """Counts the retries (and hedges) of one pool in flight against its requests in flight:
    each one holds a share from `try_acquire` until its `release`."""

    __slots__ = ("_settings", "retrying")

    def __init__(self, settings: RetrySettings) -> None:
        self._settings = settings
        self.retrying = 0

    def try_acquire(self, in_flight: int) -> bool:
        """Take a share for one retry if the budget allows it with `in_flight` requests."""
        s = self._settings
        if self.retrying < max(s.budget_min, s.budget_ratio * in_flight):
            self.retrying += 1
            return True
        return False

    def release(self) -> None:
        self.retrying -= 1
