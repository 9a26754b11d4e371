"""One generation request in the sim worker: feed the engine its choices, write what it
produces as it comes.

The request is checked and planned beforehand (request.py, plans.py). A plain answer (one
choice of filler text, nothing else asked) streams from byte templates (responses.py) with no
per-token work beyond the template; any other job renders through a `Renderer` (render.py,
responses_api.py), paying per token only for what it asked. Each choice is its own engine
sequence (vLLM runs a request with n > 1 as n sequences over the same prompt, whose blocks the
prefix cache shares), so n choices take n sequences' share of batch slots and KV cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fleetgate.http.writer import ResponseWriter
from fleetgate.openai_api import DONE_EVENT, SSE_HEADERS
from fleetgate.tokens import filler_token
from fleetgate.workers.sim.driver import TokenSink, WallClockDriver
from fleetgate.workers.sim.engine import EngineRequest, FinishedRequest
from fleetgate.workers.sim.metrics import WorkerMetrics
from fleetgate.workers.sim.plans import ChoicePlan
from fleetgate.workers.sim.render import Renderer
from fleetgate.workers.sim.request import GenerationError, Job
from fleetgate.workers.sim.responses import StreamFormat, Usage, full_response, usage

_JSON = [(b"content-type", b"application/json")]


class _Sink:
    """Receives tokens from the engine; writes stream chunks as they come."""

    __slots__ = ("close_after", "count", "done", "fmt", "seed", "writer")

    def __init__(
        self,
        job: Job,
        writer: ResponseWriter,
        fmt: StreamFormat | None,
        close_after: int,
        done: asyncio.Future[FinishedRequest],
    ) -> None:
        self.writer, self.fmt, self.close_after = writer, fmt, close_after
        self.seed = job.choices[0].seed
        self.count = 0
        self.done = done

    def token(self) -> None:
        i = self.count
        self.count = i + 1
        fmt = self.fmt
        if fmt is not None:
            chunk = fmt.token(filler_token(i, self.seed))
            if i == 0 and fmt.chat:  # vLLM sends the role with the first token, not before
                chunk = fmt.role() + chunk
            self.writer.write(chunk)
            if self.close_after and self.count >= self.close_after:
                self.writer.abort()  # the fault: the stream dies without [DONE]

    def finished(self, info: FinishedRequest) -> None:
        if not self.done.done():
            self.done.set_result(info)


class _ChoiceSink:
    """Receives one choice's tokens from the engine (any job but a plain one)."""

    __slots__ = ("count", "done", "plan", "stream")

    def __init__(
        self, plan: ChoicePlan, stream: _Stream | None, done: asyncio.Future[FinishedRequest]
    ) -> None:
        self.plan, self.stream, self.done = plan, stream, done
        self.count = 0

    def token(self) -> None:
        i = self.count
        self.count = i + 1
        if self.stream is not None:
            self.stream.token(self.plan, i)

    def finished(self, info: FinishedRequest) -> None:
        if self.stream is not None:
            self.stream.write(self.stream.renderer.finish(self.plan))
        if not self.done.done():
            self.done.set_result(info)


class _Stream:
    """A rendered stream being written; cut after `close_after` tokens (a fault) if set."""

    __slots__ = ("close_after", "count", "renderer", "writer")

    def __init__(self, renderer: Renderer, writer: ResponseWriter, close_after: int) -> None:
        self.renderer, self.writer, self.close_after = renderer, writer, close_after
        self.count = 0

    def token(self, plan: ChoicePlan, i: int) -> None:
        self.count += 1
        self.write(self.renderer.token(plan, i))
        if self.close_after and self.count >= self.close_after:
            self.writer.abort()  # the fault: the stream dies without its end

    def write(self, data: bytes) -> None:
        if data:
            self.writer.write(data)


class Generator:
    def __init__(
        self,
        model: str,
        block_size: int,
        driver: WallClockDriver,
        metrics: WorkerMetrics,
        clock: Callable[[], float],
        loop: asyncio.AbstractEventLoop,
        kv_transfer_s_per_token: float = 0.0,
    ) -> None:
        self._model = model
        self._kv_transfer_s = kv_transfer_s_per_token  # a remote prefill's KV, per token
        self._block_size = block_size
        self._driver = driver
        self._metrics = metrics
        self._clock = clock
        # Kept, not looked up per request: asyncio.get_running_loop() costs a getpid() on 3.11.
        self._loop = loop

    async def run(
        self, job: Job, writer: ResponseWriter, close_after: int, renderer: Renderer | None = None
    ) -> None:
        """Generate `job`; a plain job without a `renderer` from byte templates."""
        arrival = self._clock()
        if job.kv_receive:
            # The decode engine pulls the prompt's KV from the prefill engine before it
            # schedules the request (vLLM's NIXL connector): full blocks cross the link.
            blocks = len(job.prompt.block_hashes)
            await self._driver.wait(blocks * self._block_size * self._kv_transfer_s)
            self._driver.engine.receive_kv(job.prompt)
        if renderer is None:
            await self._run_plain(job, writer, close_after, arrival)
        else:
            await self._run_choices(job, writer, close_after, renderer, arrival)

    def _submit(
        self, job: Job, request_id: str, plan: ChoicePlan, sink: TokenSink, arrival: float
    ) -> None:
        request = EngineRequest(request_id, plan.prompt, plan.count, arrival, job.priority)
        try:
            self._driver.submit(request, sink)
        except ValueError as exc:  # e.g. a prompt larger than the whole KV cache
            raise GenerationError(400, str(exc), "messages" if job.chat else "prompt") from None

    async def _run_plain(
        self, job: Job, writer: ResponseWriter, close_after: int, arrival: float
    ) -> None:
        plan = job.choices[0]
        fmt = (
            StreamFormat(job.chat, job.request_id, job.created, self._model) if job.stream else None
        )
        sink = _Sink(job, writer, fmt, close_after, self._loop.create_future())
        self._submit(job, job.request_id, plan, sink, arrival)
        if fmt is not None:
            writer.start(200, list(SSE_HEADERS))
        try:
            info = await sink.done
        finally:
            self._driver.abort(job.request_id)
        self._metrics.finished(info)
        u = usage(info.prompt_tokens, info.output_tokens, info.cached_tokens)
        if fmt is not None:
            writer.write(fmt.finish(plan.finish_reason))
            if job.include_usage:
                writer.write(fmt.usage(u))
            writer.write(DONE_EVENT)
            writer.end()
            return
        text = "".join(filler_token(i, plan.seed) for i in range(info.output_tokens))
        params = _handoff(job) if job.kv_send else None
        body = full_response(
            chat=job.chat,
            request_id=job.request_id,
            created=job.created,
            model=self._model,
            text=text,
            reason=plan.finish_reason,
            u=u,
            kv_transfer_params=params,
        )
        writer.send(200, _JSON, body)

    async def _run_choices(
        self,
        job: Job,
        writer: ResponseWriter,
        close_after: int,
        renderer: Renderer,
        arrival: float,
    ) -> None:
        stream = _Stream(renderer, writer, close_after) if job.stream else None
        sinks = [_ChoiceSink(plan, stream, self._loop.create_future()) for plan in job.choices]
        ids = [f"{job.request_id}-{plan.index}" for plan in job.choices]
        try:
            for request_id, sink in zip(ids, sinks, strict=True):
                self._submit(job, request_id, sink.plan, sink, arrival)
            if stream is not None:
                writer.start(200, list(SSE_HEADERS))
                stream.write(renderer.opening())
            infos = [await sink.done for sink in sinks]
        finally:
            for request_id in ids:
                self._driver.abort(request_id)
        for info in infos:
            self._metrics.finished(info)
        u = _usage(job.choices, infos)
        if stream is not None:
            stream.write(renderer.closing(u))
            writer.end()
            return
        extra = {"kv_transfer_params": _handoff(job)} if job.kv_send else None
        writer.send(200, _JSON, renderer.whole(u, extra))


def _usage(plans: list[ChoicePlan], infos: list[FinishedRequest]) -> Usage:
    """Every choice's tokens; each prompt once, as vLLM counts a request with n > 1."""
    prompt = cached = 0
    seen: set[int] = set()
    for plan, info in zip(plans, infos, strict=True):
        if plan.prompt_index not in seen:
            seen.add(plan.prompt_index)
            prompt += info.prompt_tokens
            cached += info.cached_tokens
    return usage(prompt, sum(info.output_tokens for info in infos), cached)


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
