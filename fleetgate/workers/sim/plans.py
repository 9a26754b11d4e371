"""What each choice of a sim answer will say, decided before the engine runs: its tokens' text,
how many there are and why it ends.

A text answer is filler, one word per token: token i of the choice drawn from `seed` is
`filler_token(offset + i, seed)`, where `offset` counts the tokens an assistant message being
continued already holds (continue_final_message), so a continuation reads on where the prefix
stopped. Its length is the request's limit ("length"), or one drawn from the seed (lognormal,
median 128, the shape of the Azure conversation trace; "stop") less the `offset` already given.
A JSON answer (response_format) and a tool call's arguments are one token per piece of their
text as the project's token rule splits it; they end when the text does, or at the limit.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from fleetgate.tokens import filler_token, split_tokens
from fleetgate.workers.sim.prompt import PromptBlocks
from fleetgate.workers.sim.sampling import cut_at_stop
from fleetgate.workers.sim.structured import json_text
from fleetgate.workers.sim.tools import Tool, ToolCall, make_call

MAX_DRAWN_TOKENS = 4096


@dataclass(slots=True)
class ChoicePlan:
    """One choice of an answer: the engine generates `count` tokens, token i shows `piece(i)`."""

    index: int
    prompt: PromptBlocks
    prompt_index: int
    """Which of the request's prompts this answers (usage counts each prompt once)."""
    seed: int
    count: int
    finish_reason: str
    offset: int = 0
    pieces: list[str] | None = None
    """Each token's text when it is not filler (JSON, a tool call's arguments, a cut answer)."""
    tool_call: ToolCall | None = None
    """The call this choice makes; its first token is the call's head (piece ""), the rest
    pieces of its arguments."""
    echo: str = ""
    """The prompt text shown before the answer (completions' `echo`)."""

    def piece(self, i: int) -> str:
        pieces = self.pieces
        return filler_token(self.offset + i, self.seed) if pieces is None else pieces[i]

    def text(self, count: int | None = None) -> str:
        """The visible text of the first `count` tokens (all by default)."""
        return "".join(self.piece(i) for i in range(self.count if count is None else count))


@dataclass(frozen=True, slots=True)
class Shape:
    """What a request asks of every answer beyond its prompt."""

    limit: int | None = None
    """max_tokens or max_completion_tokens; None: the length is drawn."""
    min_tokens: int = 0
    stops: tuple[str, ...] = ()
    schema: dict[str, Any] | None = None
    """The JSON schema of a response_format ({}: any JSON object), None for text."""
    tool: Tool | None = None
    offset: int = 0
    """Tokens of the answer already given (the assistant message continued)."""


def drawn_length(seed: int, min_tokens: int = 0) -> int:
    """An answer's length when the client sets none: lognormal, median 128, at most 4,096."""
    drawn = random.Random(seed).lognormvariate(math.log(128), 1.0)
    return max(1, min(int(drawn), MAX_DRAWN_TOKENS), min_tokens)


def plan_choice(
    index: int, prompt: PromptBlocks, prompt_index: int, seed: int, shape: Shape
) -> ChoicePlan:
    """The choice drawn from `seed`, before stop sequences (`cut`) apply."""
    if shape.tool is not None:
        call = make_call(shape.tool, seed)
        pieces = ["", *split_tokens(call.arguments)]
        return _limited(ChoicePlan(index, prompt, prompt_index, seed, 0, "tool_calls",
                                   pieces=pieces, tool_call=call), shape)  # fmt: skip
    if shape.schema is not None:
        pieces = split_tokens(json_text(shape.schema, random.Random(seed)))[shape.offset :]
        plan = ChoicePlan(index, prompt, prompt_index, seed, 0, "stop", pieces=pieces or [""])
        return _limited(plan, shape)
    if shape.limit is not None:
        count, reason = shape.limit, "length"
    else:
        count, reason = max(1, drawn_length(seed, shape.min_tokens) - shape.offset), "stop"
    return ChoicePlan(index, prompt, prompt_index, seed, count, reason, offset=shape.offset)


def _limited(plan: ChoicePlan, shape: Shape) -> ChoicePlan:
    assert plan.pieces is not None
    plan.count = len(plan.pieces)
    if shape.limit is not None and plan.count > shape.limit:
        plan.pieces, plan.count = plan.pieces[: shape.limit], shape.limit
        plan.finish_reason = "length"
    return plan


def cut(plan: ChoicePlan, stops: tuple[str, ...]) -> None:
    """End `plan` where the first of `stops` completes, hiding the stop text ("stop")."""
    if not stops or plan.tool_call is not None:
        return
    pieces = cut_at_stop(plan.piece, plan.count, stops)
    if pieces is not None:
        plan.pieces, plan.count, plan.offset, plan.finish_reason = pieces, len(pieces), 0, "stop"
