"""The sim worker: a real OpenAI-compatible HTTP server whose answers come from the simulated
engine, at the pace a real GPU would produce them: chat and text completions (request.py says
which of their parameters it honours), the Responses API (responses_api.py) and embeddings.

Besides the OpenAI endpoints it serves what peers and benchmark clients ask of vLLM and SGLang
servers (`/health`, `/metrics` with vLLM names, `/get_load`, `/server_info`, `/model_info`,
`/flush_cache`) and fault injection at `/admin/faults`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import random
import time
from collections.abc import Awaitable, Callable

import msgspec

from fleetgate.discovery.found import Found
from fleetgate.discovery.registry import Registration
from fleetgate.http.client import HttpClient, Origin
from fleetgate.http.errors import UpstreamError
from fleetgate.http.server import HttpServer, Request, start_server
from fleetgate.http.writer import ResponseWriter
from fleetgate.openai_api import error_body, send_error
from fleetgate.traffic.redis_store import redis_client
from fleetgate.workers.sim.driver import WallClockDriver
from fleetgate.workers.sim.embeddings import Embedder
from fleetgate.workers.sim.engine import Engine
from fleetgate.workers.sim.faults import Faults, FaultState
from fleetgate.workers.sim.generation import Generator
from fleetgate.workers.sim.kv_publisher import KvEventPublisher
from fleetgate.workers.sim.metrics import WorkerMetrics
from fleetgate.workers.sim.profiles import get_profile
from fleetgate.workers.sim.render import CompletionRenderer, Renderer
from fleetgate.workers.sim.request import GenerationError, RequestParser
from fleetgate.workers.sim.responses_api import ResponsesRequests
from fleetgate.workers.sim.spec import SimSpec

_JSON = [(b"content-type", b"application/json")]
_Route = Callable[[Request, ResponseWriter], Awaitable[None]]


class SimWorker:
    """One simulated model-server replica."""

    def __init__(self, spec: SimSpec, rng: random.Random, loop: asyncio.AbstractEventLoop) -> None:
        self.spec = spec
        self.profile = get_profile(spec.profile)
        if spec.num_gpu_blocks is not None:  # vLLM's --num-gpu-blocks-override
            self.profile = dataclasses.replace(self.profile, num_gpu_blocks=spec.num_gpu_blocks)
        if spec.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling policy {spec.scheduling_policy!r}: fcfs or priority")
        self.kv_events = (
            None if spec.kv_events is None
            else KvEventPublisher(spec.kv_events, self.profile.block_size, time.time, loop)
        )  # fmt: skip
        self.engine = Engine(self.profile, spec.scheduling_policy == "priority", self.kv_events)
        self.faults = FaultState(spec.faults, rng)
        self.metrics = WorkerMetrics(
            self.engine, spec.model, self.profile.block_size, self.profile.num_gpu_blocks
        )
        self.driver = WallClockDriver(
            self.engine, time.monotonic, self._slowdown, self.metrics.steps
        )
        # Seconds of transfer per token of KV a remote prefill hands over: bytes * 8 / (Gb/s).
        kv_transfer_s = self.profile.kv_bytes_per_token * 8 / (spec.kv_link_gbps * 1e9)
        self.parser = RequestParser(
            spec.model, self.profile.block_size, self.engine.priority_scheduling, rng
        )
        self.embedder = Embedder(self.parser)
        self.responses = ResponsesRequests(self.parser, f"{rng.getrandbits(32):08x}")
        self.generator = Generator(
            model=spec.model,
            block_size=self.profile.block_size,
            driver=self.driver,
            metrics=self.metrics,
            clock=time.monotonic,
            loop=loop,
            kv_transfer_s_per_token=kv_transfer_s,
        )
        self._server: HttpServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._registration: tuple[Registration, asyncio.Task[None]] | None = None
        self._ids = itertools.count(1)
        self._routes: dict[tuple[bytes, bytes], _Route] = {
            (b"POST", b"/v1/chat/completions"): self._generate,
            (b"POST", b"/v1/completions"): self._generate,
            (b"POST", b"/v1/responses"): self._generate,
            (b"POST", b"/v1/embeddings"): self._embeddings,
            (b"GET", b"/v1/models"): self._models,
            (b"GET", b"/health"): self._health,
            (b"GET", b"/metrics"): self._metrics,
            (b"GET", b"/get_load"): self._load,
            (b"GET", b"/server_info"): self._server_info,
            (b"GET", b"/get_server_info"): self._server_info,
            (b"GET", b"/model_info"): self._model_info,
            (b"GET", b"/get_model_info"): self._model_info,
            (b"POST", b"/flush_cache"): self._flush,
            (b"GET", b"/admin/faults"): self._get_faults,
            (b"POST", b"/admin/faults"): self._set_faults,
        }

    def _slowdown(self) -> float:
        return self.faults.faults.slowdown

    async def start(self, host: str, port: int) -> HttpServer:
        """Listen (OSError when the port is taken; zmq.ZMQError for the KV-event ports)."""
        loop = asyncio.get_running_loop()
        if self.kv_events is not None:
            self.kv_events.start(host)
        self._task = loop.create_task(self.driver.run())
        self._server = await start_server(self.handle, send_error, host, port)
        if self.spec.heartbeat_url is not None:
            backend = f"{host}:{self._server.port}"
            self._heartbeat = loop.create_task(self._push_heartbeats(backend))
        register = self.spec.register
        if register is not None:
            url = f"http://{host}:{self._server.port}"
            entry = Found(model=self.spec.model, url=url, labels={"profile": self.spec.profile})
            registration = Registration(
                redis_client(register.url), register.prefix, url[7:], entry, register.interval_s
            )
            self._registration = registration, loop.create_task(registration.run())
        return self._server

    async def _push_heartbeats(self, backend: str) -> None:
        """Tell the gateway we are alive, every interval, while we are (and not while hung)."""
        assert self.spec.heartbeat_url is not None
        client = HttpClient(connect_timeout_s=self.spec.heartbeat_interval_s)
        origin = Origin.parse(self.spec.heartbeat_url)
        body = msgspec.json.encode({"backend": backend})
        try:
            while True:
                if not self.faults.faults.hang and not self.faults.crashed:
                    try:
                        response = await client.request(
                            origin, b"POST", b"/fleet/heartbeat", _JSON, body,
                            timeout_s=self.spec.heartbeat_interval_s,
                        )  # fmt: skip
                        await response.read()
                    except UpstreamError:
                        pass  # the gateway is away: keep trying
                await asyncio.sleep(self.spec.heartbeat_interval_s)
        finally:
            await client.close()

    async def stop(self) -> None:
        if self.kv_events is not None:
            self.kv_events.close()
        if self._task is not None:
            self._task.cancel()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._registration is not None:
            registration, beating = self._registration
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating  # a beat under way lands before the entry is removed
            await registration.leave()
            await registration.close()

    async def handle(self, request: Request, writer: ResponseWriter) -> None:
        if self.faults.faults.hang and request.path != b"/admin/faults":
            await asyncio.get_running_loop().create_future()  # until the client gives up
        delay = self.faults.faults.network_delay_s
        if delay > 0:
            await asyncio.sleep(delay)
        route = self._routes.get((request.method, request.path))
        if route is None:
            writer.send(404, _JSON, error_body(404, f"no route {request.path.decode('latin-1')}"))
            return
        await route(request, writer)

    def _injected(self, writer: ResponseWriter) -> bool:
        """Apply the crash and error faults to one request; True if it has been dealt with."""
        faults = self.faults
        inject = faults.admit()
        if faults.crashed and self._server is not None:
            self._server.abort()  # stop listening, cut every connection: a crash
            return True
        if inject:
            status = faults.faults.error_status
            headers = [*_JSON, (b"retry-after", b"1")] if status in (429, 503) else _JSON
            writer.send(status, headers, error_body(status, "injected fault"))
        return inject

    async def _generate(self, request: Request, writer: ResponseWriter) -> None:
        if self._injected(writer):
            return
        chat = request.path == b"/v1/chat/completions"
        faults = self.faults.faults
        renderer: Renderer | None = None
        try:
            if request.path == b"/v1/responses":
                job, renderer = self.responses.parse(request.body, f"{next(self._ids):x}")
            else:
                job = self.parser.parse(request.body, chat, f"{next(self._ids):x}")
                if not job.plain:  # a plain answer streams from byte templates
                    renderer = CompletionRenderer(job, self.spec.model)
            if faults.added_latency_s > 0:
                await asyncio.sleep(faults.added_latency_s)
            await self.generator.run(job, writer, faults.close_after_tokens, renderer)
        except GenerationError as exc:
            writer.send(exc.status, _JSON, error_body(exc.status, exc.message, exc.param))

    async def _embeddings(self, request: Request, writer: ResponseWriter) -> None:
        if self._injected(writer):
            return
        try:
            body = self.embedder.embed(request.body)
        except GenerationError as exc:
            writer.send(exc.status, _JSON, error_body(exc.status, exc.message, exc.param))
            return
        writer.send(200, _JSON, body)

    async def _models(self, request: Request, writer: ResponseWriter) -> None:
        data = {"id": self.spec.model, "object": "model", "created": 0, "owned_by": "fleetgate"}
        writer.send(200, _JSON, msgspec.json.encode({"object": "list", "data": [data]}))

    async def _health(self, request: Request, writer: ResponseWriter) -> None:
        writer.send(200, _JSON, b"{}")

    async def _metrics(self, request: Request, writer: ResponseWriter) -> None:
        writer.send(200, [(b"content-type", b"text/plain; version=0.0.4")], self.metrics.render())

    async def _load(self, request: Request, writer: ResponseWriter) -> None:
        s = self.engine.stats()
        tokens = int(s.kv_usage * self.profile.kv_capacity_tokens)
        load = [{"dp_rank": 0, "num_reqs": s.num_running + s.num_waiting,
                 "num_waiting_reqs": s.num_waiting, "num_tokens": tokens}]  # fmt: skip
        writer.send(200, _JSON, msgspec.json.encode(load))

    async def _server_info(self, request: Request, writer: ResponseWriter) -> None:
        p = self.profile
        info = {"model_path": self.spec.model, "served_model_name": self.spec.model,
                "engine": "fleetgate-sim", "profile": p.name,
                "max_num_seqs": p.max_num_seqs, "max_num_batched_tokens": p.max_num_batched_tokens,
                "block_size": p.block_size, "num_gpu_blocks": p.num_gpu_blocks}  # fmt: skip
        writer.send(200, _JSON, msgspec.json.encode(info))

    async def _model_info(self, request: Request, writer: ResponseWriter) -> None:
        info = {"model_path": self.spec.model, "is_generation": True}
        writer.send(200, _JSON, msgspec.json.encode(info))

    async def _flush(self, request: Request, writer: ResponseWriter) -> None:
        flushed = self.engine.flush_prefix_cache()
        writer.send(200, _JSON, msgspec.json.encode({"flushed": flushed}))

    async def _get_faults(self, request: Request, writer: ResponseWriter) -> None:
        writer.send(200, _JSON, msgspec.json.encode(self.faults.faults))

    async def _set_faults(self, request: Request, writer: ResponseWriter) -> None:
        try:
            update = msgspec.json.decode(request.body or b"{}")
            merged = msgspec.structs.asdict(self.faults.faults) | update
            self.faults.faults = msgspec.convert(merged, Faults).check()
        except (msgspec.DecodeError, TypeError, ValueError) as exc:
            writer.send(400, _JSON, error_body(400, f"bad faults: {exc}"))
            return
        writer.send(200, _JSON, msgspec.json.encode(self.faults.faults))
