"""`work_share` scorer: evens out the token work each backend has been given for its weight, over
the last `tau_s` seconds, so a fleet of mixed hardware is equally utilized even while other
plugins send one kind of request to some backends (`long_to_fast` sends long prompts to the
fastest: alone, that leaves the slower ones under-used when the fleet is not full).

    a_i     = token work sent to backend i, decayed:  on each pick of i at time t,
              a_i <- a_i * exp(-(t - t_i) / tau) + (prompt tokens + max_tokens, if given)
    r_i     = a_i(now) / w_i       w_i: its effective weight (typed, or calibrated: its speed)
    span    = max(max_j r_j - min_j r_j, tolerance * mean_j r_j)
    score_i = 1 - (r_i - min_j r_j) / span               (1 for all when none has work)
The least worked for its weight scores 1. A gap as wide as `tolerance` of the mean share or
wider scores the most worked 0: a deficit kept over time, which pulls a skewed split level;
narrower gaps, the noise of an even split, score in proportion, so they do not outweigh the
other scorers (a prompt's cached prefix, a shorter queue). O(n) over the candidates it is
given; the pick is recorded by `chosen`, and entries that have faded below one token (a
backend gone for many time constants) are dropped every 1,024 picks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.settings import Settings, at_least, positive_seconds

_SWEEP_EVERY = 1024  # picks between sweeps of the faded entries: O(n) / 1024 a pick


class WorkShareParams(Settings, frozen=True):
    """The `work_share` scorer's parameters."""

    tau_s: float = 30.0  # the time constant the work sent to a backend decays with
    tolerance: float = 0.25  # a gap this share of the mean or wider scores the most worked 0

    def __post_init__(self) -> None:
        positive_seconds("tau_s", self.tau_s)
        at_least("tolerance", self.tolerance, 0)


class WorkShare:
    name = "work_share"

    def __init__(
        self,
        params: WorkShareParams = WorkShareParams(),
    ) -> None:
        self._tau_s = params.tau_s
        self._tolerance = params.tolerance
        self._work: dict[BackendState, tuple[float, float]] = {}  # (a_i, when it was set)
        self._picks = 0

    def work(self, state: BackendState, now: float) -> float:
        """The token work sent to `state`, decayed to `now` (a_i above)."""
        work, at = self._work.get(state, (0.0, now))
        return work * math.exp((at - now) / self._tau_s) if now > at else work

    def known(self) -> int:
        """How many backends it keeps work for."""
        return len(self._work)

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        shares = [self.work(s, now) / s.weight for s in candidates]
        low = min(shares)
        span = max(max(shares) - low, self._tolerance * sum(shares) / len(shares))
        if span <= 0:
            return [1.0] * len(shares)
        return [1.0 - (r - low) / span for r in shares]

    def chosen(self, request: RoutingRequest, state: BackendState, now: float) -> None:
        work = request.prompt_tokens + (request.max_tokens or 0)
        self._work[state] = (self.work(state, now) + work, now)
        self._picks += 1
        if self._picks % _SWEEP_EVERY == 0:  # forget backends gone for many time constants
            faded = [s for s in self._work if self.work(s, now) < 1.0]
            for gone in faded:
                del self._work[gone]
