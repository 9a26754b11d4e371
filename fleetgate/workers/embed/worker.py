"""The embed worker: a real OpenAI-compatible embeddings server on the CPU (MiniLM, model.py)
behind the dynamic batcher (batcher.py), on fleetgate's own HTTP server.

Endpoints: `POST /v1/embeddings` (request.py says what it takes), `GET /v1/models`,
`GET /health`, `GET /metrics` (metrics.py). Requests are tokenized on the event loop as they
arrive (so usage and too-long inputs are known before they queue); the model runs one batch at
a time in one worker thread, with `intra_op_threads` threads of its own.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec

from fleetgate.http.server import HttpServer, Request, start_server
from fleetgate.http.writer import ResponseWriter
from fleetgate.openai_api import error_body, send_error
from fleetgate.traffic.door import retry_after
from fleetgate.workers.embed.batcher import Batcher, BatchRun, Overloaded
from fleetgate.workers.embed.metrics import EmbedMetrics
from fleetgate.workers.embed.model import MAX_INPUT_TOKENS, NATIVE_DIMS, MiniLM
from fleetgate.workers.embed.request import (
    MAX_INPUTS,
    RequestError,
    RequestRules,
    parse_request,
)
from fleetgate.workers.embed.settings import EmbedSettings
from fleetgate.workers.embeddings import embeddings_answer

_JSON = [(b"content-type", b"application/json")]
_Route = Callable[[Request, ResponseWriter], Awaitable[None]]


class EmbedWorker:
    def __init__(
        self, settings: EmbedSettings, model: MiniLM, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self._model = model
        self._clock = clock
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="embed-model")
        self.batcher: Batcher[list[int], list[float]] = Batcher(
            settings.batching, self._run_batch, clock, on_batch=self._on_batch
        )
        self.metrics = EmbedMetrics(self.batcher, settings.model_name)
        max_inputs = min(MAX_INPUTS, settings.batching.max_queue_items)
        self._rules = RequestRules(settings.model_name, NATIVE_DIMS, MAX_INPUT_TOKENS, max_inputs)
        model_entry = {"id": settings.model_name, "object": "model", "created": 0,
                       "owned_by": "fleetgate"}  # fmt: skip
        self._models = msgspec.json.encode({"object": "list", "data": [model_entry]})
        self._routes: dict[tuple[bytes, bytes], _Route] = {
            (b"POST", b"/v1/embeddings"): self._embeddings,
            (b"GET", b"/v1/models"): self._list_models,
            (b"GET", b"/health"): self._health,
            (b"GET", b"/metrics"): self._metrics,
        }

    async def start(self, host: str, port: int) -> HttpServer:
        self.batcher.start()
        return await start_server(self.handle, send_error, host, port)

    async def stop(self) -> None:
        await self.batcher.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def handle(self, request: Request, writer: ResponseWriter) -> None:
        route = self._routes.get((request.method, request.path))
        if route is None:
            writer.send(404, _JSON, error_body(404, f"no route {request.path.decode('latin-1')}"))
            return
        await route(request, writer)

    def _run_batch(self, batch: list[list[int]]) -> Awaitable[Sequence[list[float]]]:
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._executor, self._model.run, batch)

    def _on_batch(self, run: BatchRun) -> None:
        self.metrics.batch(run)

    async def _embeddings(self, request: Request, writer: ResponseWriter) -> None:
        started = self._clock()
        try:
            job = parse_request(request.body, request.headers, self._rules, self._model.tokenize)
            vectors = await self.batcher.submit(job.tokens, job.priority, job.timeout_s)
        except RequestError as exc:
            self.metrics.answered("invalid")
            writer.send(exc.status, _JSON, error_body(exc.status, exc.message, exc.param))
            return
        except Overloaded as exc:
            self.metrics.answered(exc.code)
            headers = [*_JSON, retry_after(exc.retry_after_s)]
            writer.send(503, headers, error_body(503, exc.message, None, exc.code))
            return
        except Exception as exc:  # the model failed: say so, keep serving
            self.metrics.answered("error")
            writer.send(500, _JSON, error_body(500, f"the model failed: {exc}"))
            return
        body = embeddings_answer(
            vectors, job.dims, job.encoding, self.settings.model_name, job.prompt_tokens
        )
        writer.send(200, _JSON, body)
        self.metrics.answered("success", self._clock() - started, job.prompt_tokens)

    async def _list_models(self, request: Request, writer: ResponseWriter) -> None:
        writer.send(200, _JSON, self._models)

    async def _health(self, request: Request, writer: ResponseWriter) -> None:
        writer.send(200, _JSON, b"{}")

    async def _metrics(self, request: Request, writer: ResponseWriter) -> None:
        writer.send(200, [(b"content-type", b"text/plain; version=0.0.4")], self.metrics.render())


async def serve_embed(settings: EmbedSettings, host: str, port: int) -> int:
    """Load the model, serve until SIGINT or SIGTERM."""
    model_path = None if settings.model_path is None else Path(settings.model_path)
    model = MiniLM(model_path, intra_op_threads=settings.intra_op_threads)
    worker = EmbedWorker(settings, model)
    try:
        server = await worker.start(host, port)
    except OSError as exc:
        print(f"fleetgate worker: cannot listen: {exc}", file=sys.stderr)
        return 1
    print(f"embed worker {settings.model_name} on http://{host}:{server.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.abort()
    await worker.stop()
    return 0
