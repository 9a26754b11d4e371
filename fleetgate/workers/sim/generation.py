"""One generation request in the sim worker: parse it, feed the engine, write what it produces.

Output length: `max_completion_tokens` or `max_tokens` when given (the engine never stops early,
so `ignore_eos` holds trivially), otherwise a length drawn from the request's `seed` (lognormal,
median 128, the shape of the Azure conversation trace), raised to `min_tokens`. The text is
filler, one word per token, the same for the same seed.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from fleetgate.http.writer import ResponseWriter
from fleetgate.openai_api import DONE_EVENT, SSE_HEADERS
from fleetgate.tokens import count_tokens, filler_token
from fleetgate.workers.sim.driver import WallClockDriver
from fleetgate.workers.sim.engine import EngineRequest, FinishedRequest
from fleetgate.workers.sim.metrics import WorkerMetrics
from fleetgate.workers.sim.prompt import PromptBlocks, from_text, from_token_ids, render_chat
from fleetgate.workers.sim.responses import StreamFormat, full_response, usage

MAX_MODEL_LEN = 131_072  # Llama-3.1's context window; prompt + output beyond it is a 400
EMBEDDING_DIM = 384


class GenerationError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class _StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class _Body(msgspec.Struct):
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
    kv_transfer_params: dict[str, Any] | None = None
    priority: int = 0  # lower first, with the engine's priority scheduling


class _EmbedBody(msgspec.Struct):
    input: str | list[Any]
    model: str | None = None


@dataclass(slots=True)
class Job:
    request_id: str
    chat: bool
    prompt: PromptBlocks
    output_tokens: int
    seed: int
    stream: bool
    include_usage: bool
    created: int
    finish_reason: str  # "length" when the client set the limit, "stop" when it was drawn
    kv_send: bool = False  # prefill for a remote decode: answer with kv_transfer_params
    kv_receive: bool = False  # decode after a remote prefill: the prompt's KV arrives first
    priority: int = 0


class _Sink:
    """Receives tokens from the engine; writes stream chunks as they come."""

    __slots__ = ("close_after", "count", "done", "fmt", "job", "writer")

    def __init__(
        self,
        job: Job,
        writer: ResponseWriter,
        fmt: StreamFormat | None,
        close_after: int,
        done: asyncio.Future[FinishedRequest],
    ) -> None:
        self.job, self.writer, self.fmt, self.close_after = job, writer, fmt, close_after
        self.count = 0
        self.done = done

    def token(self) -> None:
        i = self.count
        self.count = i + 1
        fmt = self.fmt
        if fmt is not None:
            chunk = fmt.token(filler_token(i, self.job.seed))
            if i == 0 and fmt.chat:  # vLLM sends the role with the first token, not before
                chunk = fmt.role() + chunk
            self.writer.write(chunk)
            if self.close_after and self.count >= self.close_after:
                self.writer.abort()  # the fault: the stream dies without [DONE]

    def finished(self, info: FinishedRequest) -> None:
        if not self.done.done():
            self.done.set_result(info)


class Generator:
    def __init__(
        self,
        model: str,
        block_size: int,
        driver: WallClockDriver,
        metrics: WorkerMetrics,
        rng: random.Random,
        clock: Callable[[], float],
        loop: asyncio.AbstractEventLoop,
        kv_transfer_s_per_token: float = 0.0,
    ) -> None:
        self._model = model
        self._kv_transfer_s = kv_transfer_s_per_token  # a remote prefill's KV, per token
        self._block_size = block_size
        self._driver = driver
        self._metrics = metrics
        self._rng = rng
        self._clock = clock
        # Kept, not looked up per request: asyncio.get_running_loop() costs a getpid() on 3.11.
        self._loop = loop
        self._decode = msgspec.json.Decoder(_Body)
        self._decode_embed = msgspec.json.Decoder(_EmbedBody)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self._model:
            raise GenerationError(404, f"The model `{model}` does not exist.", "model")

    def prepare(self, raw: bytes, chat: bool, serial: str) -> Job:
        try:
            body = self._decode.decode(raw)
        except msgspec.DecodeError as exc:
            raise GenerationError(400, f"invalid request body: {exc}") from None
        self._check_model(body.model)
        if (body.n or 1) != 1:
            raise GenerationError(400, "only n=1 is supported", "n")
        if body.priority and not self._driver.engine.priority_scheduling:
            message = f"Got priority {body.priority} but Priority scheduling is not enabled."
            raise GenerationError(400, message, "priority")  # vLLM's words
        prompt = self._prompt(body, chat)
        seed = body.seed if body.seed is not None else self._rng.getrandbits(32)
        limit = body.max_completion_tokens or body.max_tokens
        reason = "stop" if limit is None else "length"
        if limit is not None and limit < 1:
            raise GenerationError(400, "max_tokens must be at least 1", "max_tokens")
        if limit is None:
            drawn = random.Random(seed).lognormvariate(math.log(128), 1.0)
            limit = max(1, min(int(drawn), 4096), body.min_tokens or 0)
        elif body.min_tokens is not None and body.min_tokens > limit:
            raise GenerationError(400, "min_tokens must not exceed max_tokens", "min_tokens")
        if prompt.num_tokens + limit > MAX_MODEL_LEN:
            raise GenerationError(
                400,
                f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you "
                f"requested {prompt.num_tokens + limit} tokens ({prompt.num_tokens} in the "
                f"messages, {limit} in the completion). Please reduce the length.",
                "max_tokens",
            )
        prefix = "chatcmpl-" if chat else "cmpl-"
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        kv = body.kv_transfer_params or {}
        return Job(
            prefix + serial, chat, prompt, limit, seed, bool(body.stream), include_usage,
            int(time.time()), reason, kv_send=bool(kv.get("do_remote_decode")),
            kv_receive=bool(kv.get("do_remote_prefill")), priority=body.priority,
        )  # fmt: skip

    def _prompt(self, body: _Body, chat: bool) -> PromptBlocks:
        if chat:
            if not body.messages:
                raise GenerationError(400, "messages must be a non-empty array", "messages")
            try:
                return from_text(render_chat(body.messages), self._block_size)
            except (KeyError, AttributeError, TypeError):
                message = "each message needs a role and content"
                raise GenerationError(400, message, "messages") from None
        prompt = body.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return from_text(prompt, self._block_size)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return from_token_ids(prompt, self._block_size)
        raise GenerationError(400, "prompt must be a string or a list of token ids", "prompt")

    async def run(self, job: Job, writer: ResponseWriter, close_after: int) -> None:
        fmt = (
            StreamFormat(job.chat, job.request_id, job.created, self._model) if job.stream else None
        )
        sink = _Sink(job, writer, fmt, close_after, self._loop.create_future())
        arrival = self._clock()
        if job.kv_receive:
            # The decode engine pulls the prompt's KV from the prefill engine before it
            # schedules the request (vLLM's NIXL connector): full blocks cross the link.
            blocks = len(job.prompt.block_hashes)
            await self._driver.wait(blocks * self._block_size * self._kv_transfer_s)
            self._driver.engine.receive_kv(job.prompt)
        request = EngineRequest(
            job.request_id, job.prompt, job.output_tokens, arrival, job.priority
        )
        try:
            self._driver.submit(request, sink)
        except ValueError as exc:  # e.g. a prompt larger than the whole KV cache
            raise GenerationError(400, str(exc), "messages" if job.chat else "prompt") from None
        if fmt is not None:
            writer.start(200, list(SSE_HEADERS))
        try:
            info = await sink.done
        finally:
            self._driver.abort(job.request_id)
        self._metrics.finished(info)
        u = usage(info.prompt_tokens, info.output_tokens, info.cached_tokens)
        if fmt is not None:
            writer.write(fmt.finish(job.finish_reason))
            if job.include_usage:
                writer.write(fmt.usage(u))
            writer.write(DONE_EVENT)
            writer.end()
            return
        text = "".join(filler_token(i, job.seed) for i in range(info.output_tokens))
        params = _handoff(job) if job.kv_send else None
        body = full_response(
            job.chat, job.request_id, job.created, self._model, text, job.finish_reason, u, params
        )
        writer.send(200, [(b"content-type", b"application/json")], body)

    def embed(self, raw: bytes) -> bytes:
        """Deterministic unit vectors from a hash of each input; no engine time."""
        try:
            body = self._decode_embed.decode(raw)
        except msgspec.DecodeError as exc:
            raise GenerationError(400, f"invalid request body: {exc}") from None
        self._check_model(body.model)
        inputs = [body.input] if isinstance(body.input, str) else body.input
        data, tokens = [], 0
        for i, text in enumerate(inputs):
            text = str(text)
            tokens += count_tokens(text)
            digest = hashlib.sha256(text.encode()).digest() * (EMBEDDING_DIM * 4 // 32)
            raw_vec = struct.unpack(f"<{EMBEDDING_DIM}i", digest[: EMBEDDING_DIM * 4])
            norm = math.sqrt(sum(v * v for v in raw_vec)) or 1.0
            vec = [v / norm for v in raw_vec]
            data.append({"object": "embedding", "index": i, "embedding": vec})
        return msgspec.json.encode(
            {"object": "list", "data": data, "model": self._model,
             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        )  # fmt: skip


def _handoff(job: Job) -> dict[str, Any]:
    """What a prefill engine hands the decode side, shaped as vLLM's NixlConnector does. The
    sim's decode side needs none of it: the prompt's block hashes say which KV arrives."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": job.request_id,
        "remote_block_ids": list(range(len(job.prompt.block_hashes))),
        "remote_host": None,
        "remote_port": None,
        "tp_size": 1,
    }
