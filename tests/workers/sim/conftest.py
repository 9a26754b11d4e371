"""Fixtures for the sim worker's tests: one worker on a free localhost port, spoken to over
real HTTP, raw or through the official openai SDK."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator

import openai
import pytest

from fleetgate.http.client import HttpClient, Origin
from fleetgate.http.sse import SseDecoder
from fleetgate.workers.sim.spec import SimSpec
from fleetgate.workers.sim.worker import SimWorker

GUARD_S = 10.0
JSON = [(b"content-type", b"application/json")]


class Worker:
    def __init__(self, client: HttpClient, origin: Origin) -> None:
        self.client = client
        self.origin = origin

    async def call(self, method: bytes, path: bytes, body: object = None) -> tuple[int, bytes]:
        data = b"" if body is None else json.dumps(body).encode()
        response = await self.client.request(self.origin, method, path, JSON, data)
        return response.status, await asyncio.wait_for(response.read(), GUARD_S)

    async def stream(
        self, body: dict[str, object], path: bytes = b"/v1/chat/completions"
    ) -> list[dict[str, object]]:
        response = await self.client.request(
            self.origin, b"POST", path, JSON, json.dumps(body).encode()
        )
        decoder, events = SseDecoder(), []
        async for chunk in response.chunks():
            for data in decoder.feed(chunk):
                if data != b"[DONE]":
                    events.append(json.loads(data))
        return events


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    loop = asyncio.get_running_loop()
    sim = SimWorker(SimSpec(model="m", profile="h100-llama3-8b"), random.Random(7), loop)
    server = await sim.start("127.0.0.1", 0)
    client = HttpClient()
    yield Worker(client, Origin.parse(f"http://127.0.0.1:{server.port}"))
    await client.close()
    server.abort()
    await sim.stop()


@pytest.fixture
async def sdk(worker: Worker) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official SDK, pointed at the `worker` fixture's worker."""
    base = f"http://{worker.origin.host}:{worker.origin.port}/v1"
    client = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0)
    yield client
    await client.close()
