"""`length_split` filter: long prompts go to the backends set aside for them, short ones to the
rest, so a long prefill never sits in front of a short interactive request.

A request is long when its estimated prompt tokens (routing/base.py) reach `threshold_tokens`.
Backends labelled `<label>: long` (by default `length: long`) take the long requests; every
other backend takes the short ones. When no candidate is of the request's class, all stay:
a split is a preference, never a reason to fail. O(n) over the candidates.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.settings import Settings, at_least


class LengthSplitParams(Settings, frozen=True):
    """The `length_split` filter's parameters."""

    threshold_tokens: int = 4096  # a prompt this long (estimated tokens) is long
    label: str = "length"  # backends labelled `<label>: long` take the long prompts

    def __post_init__(self) -> None:
        at_least("threshold_tokens", self.threshold_tokens, 1)


class LengthSplit:
    name = "length_split"

    def __init__(
        self,
        params: LengthSplitParams = LengthSplitParams(),
    ) -> None:
        self._threshold = params.threshold_tokens
        self._label = params.label

    def filter(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> Sequence[BackendState]:
        long = request.prompt_tokens >= self._threshold
        label = self._label
        kept = [s for s in candidates if (s.backend.labels.get(label) == "long") == long]
        return kept or candidates
