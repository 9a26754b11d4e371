"""A chat or text completion request to the sim worker, checked and turned into a `Job`: the
prompts, and a plan of what each choice will say (plans.py).

What it honours of OpenAI's request: `n` (choice i drawn from seed + i, as vLLM seeds the
children of a parallel-sampling request), `stop` (a string or up to 4), `logprobs` and
`top_logprobs` (chat) or `logprobs: k` (completions), `echo` and a list of prompts
(completions: n choices per prompt, indexed prompt by prompt), `tools` and `tool_choice`
(tools.py), `response_format` (structured.py), `continue_final_message` (chat: the last,
assistant, message is continued rather than answered), `min_tokens`, `priority`, vLLM's
`kv_transfer_params`. Every value it cannot honour is a 400 that says what to change.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from fleetgate.chat_text import message_text, render_chat
from fleetgate.tokens import count_tokens
from fleetgate.workers.sim.plans import ChoicePlan, Shape, cut, plan_choice
from fleetgate.workers.sim.prompt import PromptBlocks, from_text, from_token_ids
from fleetgate.workers.sim.sampling import MAX_TOP_LOGPROBS
from fleetgate.workers.sim.structured import check_response_format
from fleetgate.workers.sim.tools import chosen_tool, parse_tools

MAX_MODEL_LEN = 131_072  # Llama-3.1's context window; prompt + output beyond it is a 400
MAX_N = 128  # OpenAI's limit on choices per request
MAX_STOPS = 4


class GenerationError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class _StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class Body(msgspec.Struct):
    """The fields of a chat or text completion request the sim reads; others are ignored."""

    model: str | None = None
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[Any] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    min_tokens: int | None = None
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    seed: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    echo: bool | None = None
    tools: Any = None
    tool_choice: Any = None
    response_format: Any = None
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None
    kv_transfer_params: dict[str, Any] | None = None
    priority: int = 0  # lower first, with the engine's priority scheduling


@dataclass(slots=True)
class Job:
    request_id: str
    chat: bool
    choices: list[ChoicePlan]
    stream: bool
    include_usage: bool
    created: int
    plain: bool
    """One choice of filler text and nothing else asked: rendered from byte templates."""
    logprobs: int | None = None
    """Top logprobs per token (chat's top_logprobs, completions' logprobs); None: not asked."""
    kv_send: bool = False  # prefill for a remote decode: answer with kv_transfer_params
    kv_receive: bool = False  # decode after a remote prefill: the prompt's KV arrives first
    priority: int = 0

    @property
    def prompt(self) -> PromptBlocks:
        return self.choices[0].prompt


class RequestParser:
    """Checks requests against one worker's model and engine."""

    def __init__(
        self, model: str, block_size: int, priority_scheduling: bool, rng: random.Random
    ) -> None:
        self.model = model
        self._block_size = block_size
        self._priority_scheduling = priority_scheduling
        self._rng = rng
        self._decode = msgspec.json.Decoder(Body)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model:
            raise GenerationError(404, f"The model `{model}` does not exist.", "model")

    def parse(self, raw: bytes, chat: bool, serial: str) -> Job:
        try:
            body = self._decode.decode(raw)
        except msgspec.DecodeError as exc:
            raise GenerationError(400, f"invalid request body: {exc}") from None
        return self.job(body, chat, ("chatcmpl-" if chat else "cmpl-") + serial)

    def job(self, body: Body, chat: bool, request_id: str) -> Job:
        self.check_model(body.model)
        n = 1 if body.n is None else body.n
        if not 1 <= n <= MAX_N:
            raise GenerationError(400, f"n must be between 1 and {MAX_N}, got {n}", "n")
        if body.priority and not self._priority_scheduling:
            message = f"Got priority {body.priority} but Priority scheduling is not enabled."
            raise GenerationError(400, message, "priority")  # vLLM's words
        texts, prompts = self._prompts(body, chat)
        shape = self._shape(body, chat)
        logprobs = _logprobs(body, chat)
        seed = body.seed if body.seed is not None else self._rng.getrandbits(32)
        echo = bool(body.echo) and not chat
        if echo and texts is None:
            raise GenerationError(400, "echo needs a text prompt (the sim has no detokenizer)",
                                  "echo")  # fmt: skip
        choices = []
        for p, prompt in enumerate(prompts):
            for i in range(n):
                plan = plan_choice(p * n + i, prompt, p, seed + i, shape)
                _check_length(prompt, plan.count, chat)
                cut(plan, shape.stops)
                if echo and texts is not None:
                    plan.echo = texts[p]
                choices.append(plan)
        plain = len(choices) == 1 and shape == Shape(shape.limit, shape.min_tokens) and not echo
        kv = body.kv_transfer_params or {}
        return Job(
            request_id=request_id,
            chat=chat,
            choices=choices,
            stream=bool(body.stream),
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
            created=int(time.time()),
            plain=plain and logprobs is None,
            logprobs=logprobs,
            kv_send=bool(kv.get("do_remote_decode")),
            kv_receive=bool(kv.get("do_remote_prefill")),
            priority=body.priority,
        )

    def _prompts(self, body: Body, chat: bool) -> tuple[list[str] | None, list[PromptBlocks]]:
        """The prompts' texts (None for token ids) and blocks."""
        bs = self._block_size
        if chat:
            if not body.messages:
                raise GenerationError(400, "messages must be a non-empty array", "messages")
            if body.continue_final_message and body.add_generation_prompt:
                message = "Cannot set both continue_final_message and add_generation_prompt."
                raise GenerationError(400, message, "continue_final_message")  # vLLM's words
            try:
                text = render_chat(body.messages, bool(body.continue_final_message))
            except (KeyError, AttributeError, TypeError):
                message = "each message needs a role and content"
                raise GenerationError(400, message, "messages") from None
            except ValueError as exc:
                raise GenerationError(400, str(exc), "messages") from None
            return [text], [from_text(text, bs)]
        prompt = body.prompt
        if isinstance(prompt, str):
            return [prompt], [from_text(prompt, bs)]
        if isinstance(prompt, list) and prompt and all(isinstance(t, str) for t in prompt):
            return prompt, [from_text(t, bs) for t in prompt]
        if isinstance(prompt, list) and prompt and all(_token_ids(t) for t in prompt):
            return None, [from_token_ids(t, bs) for t in prompt]
        if _token_ids(prompt):
            assert isinstance(prompt, list)
            return None, [from_token_ids(prompt, bs)]
        message = "prompt must be a string, a list of strings or a list of token ids (or lists)"
        raise GenerationError(400, message, "prompt")

    def _shape(self, body: Body, chat: bool) -> Shape:
        limit = body.max_completion_tokens or body.max_tokens
        if limit is not None and limit < 1:
            raise GenerationError(400, "max_tokens must be at least 1", "max_tokens")
        min_tokens = body.min_tokens or 0
        if limit is not None and min_tokens > limit:
            raise GenerationError(400, "min_tokens must not exceed max_tokens", "min_tokens")
        stops = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        if len(stops) > MAX_STOPS or not all(stops):
            message = f"stop must be a non-empty string or up to {MAX_STOPS} of them"
            raise GenerationError(400, message, "stop")
        try:
            schema = check_response_format(body.response_format)
        except ValueError as exc:
            raise GenerationError(400, str(exc), "response_format") from None
        tool = None
        if chat:
            try:
                tools = parse_tools(body.tools)
            except ValueError as exc:
                raise GenerationError(400, str(exc), "tools") from None
            try:
                tool = chosen_tool(tools, body.tool_choice, body.messages or [])
            except ValueError as exc:
                raise GenerationError(400, str(exc), "tool_choice") from None
        offset = 0
        if chat and body.continue_final_message and body.messages:
            offset = count_tokens(message_text(body.messages[-1].get("content")))
        return Shape(limit, min_tokens, stops, schema, tool, offset)


def _logprobs(body: Body, chat: bool) -> int | None:
    if chat:
        if not isinstance(body.logprobs, bool | None):
            raise GenerationError(400, "logprobs must be true or false", "logprobs")
        top = body.top_logprobs
        if top is not None and not body.logprobs:
            raise GenerationError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            message = f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}"
            raise GenerationError(400, message, "top_logprobs")
        return (top or 0) if body.logprobs else None
    k = body.logprobs
    if k is None:
        return None
    if isinstance(k, bool) or not 0 <= k <= MAX_TOP_LOGPROBS:
        message = f"logprobs must be an integer between 0 and {MAX_TOP_LOGPROBS}"
        raise GenerationError(400, message, "logprobs")
    return k


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def _check_length(prompt: PromptBlocks, output: int, chat: bool) -> None:
    if prompt.num_tokens + output > MAX_MODEL_LEN:
        raise GenerationError(
            400,
            f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you "
            f"requested {prompt.num_tokens + output} tokens ({prompt.num_tokens} in the "
            f"messages, {output} in the completion). Please reduce the length.",
            "max_tokens",
        )
