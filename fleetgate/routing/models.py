"""Model-level routing: which pool a request's `model` name goes to, before any backend is
picked. Clients may send names that are not pools:

- alias:  a second name for a pool (`gpt-4o-mini` -> `llama-3.1-8b-instruct`).
- split:  weighted shares between pools, for canary and blue-green rollouts. A request with a
          session key (x-session-id, or `user`) always lands on the same side: the side is
          xxh3_64(key) mod the total weight; without one it is drawn at random by weight.
- tiers:  a cheap pool unless the request is hard, then a strong one. The header
          `x-fleetgate-tier: cheap|strong` marks a request; otherwise a classifier decides.

The shipped classifier, `length_keywords`: a request is hard when its estimated prompt tokens
reach `max_prompt_tokens`, or its prompt contains one of `keywords` (ASCII case-insensitive).
Any object with `is_hard(request) -> bool` can replace it.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

from xxhash import xxh3_64_intdigest

from fleetgate.routing.base import RoutingRequest

TIER_HEADER = b"x-fleetgate-tier"


class Classifier(Protocol):
    def is_hard(self, request: RoutingRequest) -> bool: ...


class LengthKeywords:
    name = "length_keywords"

    def __init__(self, max_prompt_tokens: int = 2048, keywords: Sequence[str] = ()) -> None:
        if max_prompt_tokens < 1:
            raise ValueError("length_keywords needs max_prompt_tokens >= 1")
        self._max = max_prompt_tokens
        self._keywords = tuple(k.lower().encode() for k in keywords if k)

    def is_hard(self, request: RoutingRequest) -> bool:
        if request.prompt_tokens >= self._max:
            return True
        if not self._keywords:
            return False
        text = bytes(request.prompt).lower()
        return any(k in text for k in self._keywords)


class ModelRoute(Protocol):
    def target(self, request: RoutingRequest, headers: Mapping[bytes, bytes]) -> str: ...


@dataclass(frozen=True, slots=True)
class Alias:
    model: str

    def target(self, request: RoutingRequest, headers: Mapping[bytes, bytes]) -> str:
        return self.model


class Split:
    def __init__(self, shares: Sequence[tuple[str, float]], rng: random.Random) -> None:
        if not shares or any(not w > 0 for _, w in shares):
            raise ValueError("a split needs at least one model, each with a weight > 0")
        self._models = [m for m, _ in shares]
        self._bounds = list(accumulate(w for _, w in shares))
        self._rng = rng

    def target(self, request: RoutingRequest, headers: Mapping[bytes, bytes]) -> str:
        total = self._bounds[-1]
        key = request.session_key
        if key is not None:  # sticky: the same user sees the same version
            point = xxh3_64_intdigest(key.encode()) / 2**64 * total
        else:
            point = self._rng.random() * total
        return self._models[min(bisect_right(self._bounds, point), len(self._models) - 1)]


@dataclass(frozen=True, slots=True)
class Tiers:
    cheap: str
    strong: str
    classifier: Classifier

    def target(self, request: RoutingRequest, headers: Mapping[bytes, bytes]) -> str:
        marked = headers.get(TIER_HEADER)
        if marked == b"strong":
            return self.strong
        if marked == b"cheap":
            return self.cheap
        return self.strong if self.classifier.is_hard(request) else self.cheap
