"""What kind of engine a backend is, and what the gateway does differently for each.

    kind       health    load metrics read (GET /metrics)            a broken stream goes on by
    vllm       /health   vllm:num_requests_running/_waiting, KV use   continue_final_message
    sglang     /health   sglang:num_running_reqs/num_queue_reqs, ...  continue_final_message
    llamacpp   /health   llamacpp:requests_processing/_deferred       assistant prefill
    tgi        /health   tgi_batch_current_size, tgi_queue_size       (not continued)
    ollama     /api/version  (none)                                   (not continued)
    fleetgate  /health   vllm's names (its sim worker is vLLM-like)   continue_final_message
    openai     /v1/models  (none)                                     (not continued)

A backend's kind comes from its config (`backends[].engine`) or, by default (`auto`), from
probing it: its `/v1/models` owner (`owned_by`), the names its `/metrics` exports, its
`Server` header, Ollama's `/api/version`; anything else OpenAI-compatible is `openai`. Until a
probe has answered, a backend is treated as vLLM-like (`pending`): the defaults the gateway
has always had. "Continued" means a stream cut mid-answer is finished on another backend
(resilience/continuation.py): with vLLM's `continue_final_message` (the partial answer as
the last assistant message, continued rather than answered), or with the assistant prefill
llama.cpp's server applies whenever the last message is the assistant's. A backend of a kind
that has neither would answer the partial answer afresh, so the client gets an error event
instead of a silently different answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import msgspec

Resume = Literal["continue_final_message", "assistant_prefill", "none"]
KINDS = ("auto", "vllm", "sglang", "llamacpp", "tgi", "ollama", "fleetgate", "openai")


@dataclass(frozen=True, slots=True)
class Engine:
    kind: str
    health_path: str  # what an `http` health check asks, unless the pool names a path
    metrics: bool  # it exports load metrics the gateway reads (fleet/engine_load.py)
    resume: Resume  # how a stream it takes over is continued


ENGINES = {
    engine.kind: engine
    for engine in (
        Engine("vllm", "/health", True, "continue_final_message"),
        Engine("sglang", "/health", True, "continue_final_message"),
        Engine("llamacpp", "/health", True, "assistant_prefill"),
        Engine("tgi", "/health", True, "none"),
        Engine("ollama", "/api/version", False, "none"),
        Engine("fleetgate", "/health", True, "continue_final_message"),
        Engine("openai", "/v1/models", False, "none"),
    )
}
PENDING = Engine("pending", "/health", True, "continue_final_message")  # `auto`, not probed


def configured(kind: str) -> Engine:
    """The engine a backend's config names; PENDING for `auto` (it is probed)."""
    return PENDING if kind == "auto" else ENGINES[kind]


# `/v1/models`' owned_by, the prefix of `/metrics`' names, and the `Server` header of each.
_OWNERS = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp", "fleetgate": "fleetgate",
           "tgi": "tgi", "ollama": "ollama"}  # fmt: skip
_METRICS = re.compile(rb"^(vllm:|sglang:|llamacpp:|tgi_)", re.MULTILINE)
_METRIC_KINDS = {b"vllm:": "vllm", b"sglang:": "sglang", b"llamacpp:": "llamacpp", b"tgi_": "tgi"}
_SERVERS = (("llama.cpp", "llamacpp"), ("text-generation-inference", "tgi"), ("ollama", "ollama"))


class _Model(msgspec.Struct):
    owned_by: str = ""


class _Models(msgspec.Struct):
    data: list[_Model] = []


_decode_models = msgspec.json.Decoder(_Models).decode


def by_models(body: bytes, server: bytes | None) -> str | None:
    """The kind a `/v1/models` answer (and its `Server` header) names, or None."""
    try:
        owners = {model.owned_by.lower() for model in _decode_models(body).data}
    except msgspec.DecodeError:
        owners = set()
    for owner in owners:
        if owner in _OWNERS:
            return _OWNERS[owner]
    header = (server or b"").decode("latin-1").lower()
    return next((kind for name, kind in _SERVERS if name in header), None)


def by_metrics(text: bytes) -> str | None:
    """The kind whose names a `/metrics` answer exports, or None."""
    found = _METRICS.search(text)
    return None if found is None else _METRIC_KINDS[found.group(1)]
