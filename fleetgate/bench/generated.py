"""Generated workloads: shared-prefix groups and synthetic length distributions.

Neither has times of its own (every spec is stamped 0): send them with Poisson arrivals.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from fleetgate.bench.workloads import Endpoint, Message, RequestSpec, user_request
from fleetgate.tokens import filler_text

LengthKind = Literal["fixed", "uniform", "exponential"]
LENGTH_KINDS: tuple[LengthKind, ...] = ("fixed", "uniform", "exponential")


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A distribution of token counts, never below 1.

    fixed: always `mean`. uniform: integers in [mean * (1 - range_ratio), mean * (1 +
    range_ratio)], so the mean stays `mean` (vLLM's random dataset draws the same way).
    exponential: round(Exp(1 / mean)), for heavy spread with the same mean.
    """

    mean: int
    kind: LengthKind = "fixed"
    range_ratio: float = 0.0  # uniform only; 0 <= range_ratio < 1

    def __post_init__(self) -> None:
        if self.mean < 1:
            raise ValueError(f"mean length must be at least 1, not {self.mean}")
        if self.kind not in LENGTH_KINDS:
            raise ValueError(f"length distribution {self.kind!r} is not one of {LENGTH_KINDS}")
        if not 0.0 <= self.range_ratio < 1.0:
            raise ValueError(f"range ratio must be in [0, 1), not {self.range_ratio}")

    def draw(self, rng: random.Random) -> int:
        if self.kind == "uniform":
            low = max(1, math.floor(self.mean * (1.0 - self.range_ratio)))
            return rng.randint(low, math.ceil(self.mean * (1.0 + self.range_ratio)))
        if self.kind == "exponential":
            return max(1, round(rng.expovariate(1.0 / self.mean)))
        return self.mean


def synthetic(
    rng: random.Random,
    *,
    input_len: LengthDist,
    output_len: LengthDist,
    endpoint: Endpoint = "chat",
) -> Iterator[RequestSpec]:
    """Endless requests with fresh filler prompts and lengths drawn from the distributions."""
    while True:
        n_in = input_len.draw(rng)
        n_out = output_len.draw(rng)
        yield user_request(0.0, filler_text(n_in, rng), n_in, n_out, endpoint)


@dataclass(frozen=True, slots=True)
class SharedPrefixShape:
    """Groups of prompts that share a system prompt; defaults are SGLang's
    generated-shared-prefix benchmark (bench_serving.py --dataset-name generated-shared-prefix).
    """

    groups: int = 64
    prompts_per_group: int = 16
    system_prompt_len: int = 2048  # tokens shared by a group
    question_len: int = 128  # tokens unique to each prompt
    output_len: int = 256

    def __post_init__(self) -> None:
        for name in ("groups", "prompts_per_group", "question_len", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"shared-prefix {name} must be at least 1")
        if self.system_prompt_len < 0:
            raise ValueError("shared-prefix system_prompt_len must not be negative")


def shared_prefix(
    rng: random.Random,
    shape: SharedPrefixShape,
    *,
    endpoint: Endpoint = "chat",
) -> Iterator[RequestSpec]:
    """Every (group, prompt) once, in an order shuffled by `rng`.

    Each request is a system message (its group's prompt) and a user message (a question of
    its own), so requests of a group share exactly `system_prompt_len` tokens of prefix.
    """
    systems = [filler_text(shape.system_prompt_len, rng) for _ in range(shape.groups)]
    order = [g for g in range(shape.groups) for _ in range(shape.prompts_per_group)]
    rng.shuffle(order)
    n_in = shape.system_prompt_len + shape.question_len
    for group in order:
        # Questions are drawn as they are sent, so only the system prompts are built up front.
        question = filler_text(shape.question_len, rng)
        messages = (Message("system", systems[group]), Message("user", question))
        yield RequestSpec(0.0, messages, n_in, shape.output_len, endpoint, group)
