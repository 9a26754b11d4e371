"""`long_to_fast` filter: long prompts go only to the fastest backends, short ones anywhere.

A prefill chunk stalls every decode that shares its engine step; the stall lasts the chunk's
tokens times the engine's compute per token, so on a GPU 2.7x slower it stalls 2.7x longer.
On a mixed fleet, the short answers decoding on the slow GPUs are the ones that miss a
per-token SLO. Keeping long prompts off the slow GPUs bounds their stalls; queue-aware scorers
then give the slow GPUs more of the short requests, so the load still evens out.

    long   = estimated prompt tokens >= threshold_tokens
    fast_i = w_i >= share x W                 (w: effective weight, calibrated from speed;
                                               W = max_j w_j)
    b_i    = pending_prefill_i x W / w_i      (prompt tokens awaiting prefill, on the pool's
                                               load board, in the time the fastest backend
                                               takes over them)
    keep   = {i : fast_i}   if long and min_{fast} b_i <= min_j b_j + slack_tokens
             every candidate otherwise
The guard (the second condition) keeps the fast backends from taking more than they can: when
they are few (one H100 among seven A100s) and the long prompts many, each of them builds a
prefill backlog `slack_tokens` longer than the least busy backend's, and long prompts overflow
to every candidate, where the queue scorers place them. On an even fleet every backend is fast,
and the filter changes nothing. O(n) over the candidates, and O(1) for a short prompt.

In a pool larger than the pipeline's shortlist the candidates are a random sample of it, which
may hold no fast backend, and then W would be a slow one's. So for a long prompt the filter
nominates up to `NOMINATED` of the pool's fast backends, drawn at random, and the shortlist
holds some (the pipeline tells it the whole candidate set, `roster`; the pool's fast backends
are found again at most every `REFRESH_S`, O(n) a second). W stays the candidates' own: after
another filter has dropped the fastest kind, the fastest that remain are the ones to keep.
A pick stays O(shortlist).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import CandidateLoads
from fleetgate.settings import Settings, at_least, within

REFRESH_S = 1.0  # how old the list of the pool's fast backends may be
NOMINATED = 4  # fast backends put in a large pool's shortlist for a long prompt


class LongToFastParams(Settings, frozen=True):
    """The `long_to_fast` filter's parameters."""

    threshold_tokens: int = 2048  # a prompt this long (estimated tokens) is long
    share: float = 0.75  # fast: an effective weight at least this share of the fastest's
    slack_tokens: int = 8192  # the fast backends' prefill backlog allowed over the least busy's

    def __post_init__(self) -> None:
        at_least("threshold_tokens", self.threshold_tokens, 1)
        within("share", self.share, 0, 1, open_low=True)
        at_least("slack_tokens", self.slack_tokens, 0)


class LongToFast:
    name = "long_to_fast"

    def __init__(
        self,
        loads: CandidateLoads,
        params: LongToFastParams = LongToFastParams(),
        *,
        rng: random.Random | None = None,
    ) -> None:
        self._loads = loads
        self._threshold = params.threshold_tokens
        self._share = params.share
        self._slack = params.slack_tokens
        self._rng = rng or random.Random(0)
        self._members: Sequence[BackendState] = ()  # the whole candidate set, when told it
        self._fast: list[BackendState] = []  # those of it within `share` of its fastest
        self._found_at = -math.inf  # when they were found

    def roster(self, candidates: Sequence[BackendState]) -> None:
        self._members = candidates
        self._found_at = -math.inf

    def nominate(self, request: RoutingRequest, now: float) -> list[str]:
        """Some fast backends of the pool, by id, for a long prompt; none for a short one."""
        if request.prompt_tokens < self._threshold or not self._members:
            return []
        fast = self._pool_fast(now)
        drawn = fast if len(fast) <= NOMINATED else self._rng.sample(fast, NOMINATED)
        return [state.backend.id for state in drawn]

    def _pool_fast(self, now: float) -> list[BackendState]:
        """The fast backends of the whole candidate set, found again when REFRESH_S has passed
        (or the clock went back: a simulator's virtual time may restart)."""
        if not 0.0 <= now - self._found_at < REFRESH_S:
            bar = self._share * max((s.weight for s in self._members), default=0.0)
            self._fast = [s for s in self._members if s.weight >= bar]
            self._found_at = now
        return self._fast

    def filter(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> Sequence[BackendState]:
        if request.prompt_tokens < self._threshold or len(candidates) < 2:
            return candidates
        top = max(s.weight for s in candidates)
        bar = self._share * top
        fast = [s for s in candidates if s.weight >= bar]
        if len(fast) == len(candidates):
            return candidates
        loaded = self._loads.of(candidates)
        least_fast = min(load.pending_prefill / s.weight for s, load in loaded if s.weight >= bar)
        least = min(load.pending_prefill / s.weight for s, load in loaded)
        return fast if (least_fast - least) * top <= self._slack else candidates
