"""An embeddings request to the embed worker, checked and tokenized before it queues: every
input it cannot embed is a 400 that says what to send instead.

Priority: the `x-fleetgate-priority` header, else the body's `priority`: a class name
(critical = 0, standard = 1, sheddable = 2) or any integer, the lowest first as vLLM orders
`priority`; neither: standard. Queue timeout: the `x-fleetgate-queue-timeout-s` header (seconds)
may shorten the worker's `queue_timeout_ms` for one request, as it does at the gateway.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from fleetgate.traffic.priority import Priority
from fleetgate.workers.embeddings import InvalidEmbeddingsRequest, parse_embeddings

PRIORITY_HEADER = b"x-fleetgate-priority"
QUEUE_TIMEOUT_HEADER = b"x-fleetgate-queue-timeout-s"
MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


class RequestError(Exception):
    """An OpenAI-shaped error answer: its status, message and the field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


@dataclass(frozen=True, slots=True)
class EmbedJob:
    tokens: list[list[int]]  # each input's token ids
    dims: int
    encoding: Literal["float", "base64"]
    priority: int
    timeout_s: float | None  # the client's shorter queue timeout, if it asked for one

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.tokens)


@dataclass(frozen=True, slots=True)
class RequestRules:
    model: str  # the one model id served; a request may name it or none
    native_dims: int
    max_input_tokens: int
    max_inputs: int  # per request: at most MAX_INPUTS, and no more than the queue holds


def parse_request(
    raw: bytes,
    headers: dict[bytes, bytes],
    rules: RequestRules,
    tokenize: Callable[[list[str]], list[list[int]]],
) -> EmbedJob:
    """The job a request asks for; RequestError for one the worker cannot serve."""
    try:
        body, dims = parse_embeddings(raw, rules.native_dims)
    except InvalidEmbeddingsRequest as exc:
        raise RequestError(400, exc.message, exc.param) from None
    if body.model is not None and body.model != rules.model:
        raise RequestError(404, f"The model `{body.model}` does not exist.", "model")
    texts = _texts(body.input, rules.max_inputs)
    tokens = tokenize(texts)
    for i, ids in enumerate(tokens):
        if len(ids) > rules.max_input_tokens:
            raise RequestError(
                400,
                f"Input {i} is {len(ids)} tokens long; this model takes at most "
                f"{rules.max_input_tokens}. Shorten it or split it.",
                "input",
            )
    header = headers.get(PRIORITY_HEADER)
    asked = header.decode("latin-1") if header is not None else body.priority
    return EmbedJob(tokens, dims, body.encoding_format, _priority(asked), _timeout_s(headers))


def _texts(value: str | list[object], max_inputs: int) -> list[str]:
    inputs = [value] if isinstance(value, str) else value
    if not inputs:
        raise RequestError(400, "input must be a string or a non-empty list of strings", "input")
    if len(inputs) > max_inputs:
        message = f"{len(inputs)} inputs in one request; this server takes at most {max_inputs}"
        raise RequestError(400, message, "input")
    texts = []
    for i, item in enumerate(inputs):
        if not isinstance(item, str):
            raise RequestError(
                400,
                "This server embeds text only: token arrays are not supported. Send input as "
                "a string or a list of strings.",
                "input",
            )
        if not item:
            raise RequestError(400, f"Input {i} is an empty string.", "input")
        texts.append(item)
    return texts


def _priority(asked: str | int | None) -> int:
    if asked is None:
        return int(Priority.STANDARD)
    if isinstance(asked, int):
        return asked
    try:
        return int(asked)
    except ValueError:
        pass
    try:
        return int(Priority.parse(asked))
    except ValueError as exc:
        raise RequestError(400, f"priority: {exc}, or an integer", "priority") from None


def _timeout_s(headers: dict[bytes, bytes]) -> float | None:
    raw = headers.get(QUEUE_TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        message = (
            f"x-fleetgate-queue-timeout-s: a number of seconds > 0, got {raw.decode('latin-1')!r}"
        )
        raise RequestError(400, message)
    return seconds
