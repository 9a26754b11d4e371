"""A client's key stays at the gateway; each backend gets its own; the tokens a tenant is
charged are the engine's `usage`. Over a recording upstream on a real socket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from fleetgate.config import parse_config
from fleetgate.serve import start_gateway

CLIENT_KEY, BACKEND_KEY = "sk-client-secret-key", "backend-secret"


class Recorder:
    """An OpenAI-compatible upstream that answers every chat with 5 completion tokens and
    keeps each request's headers."""

    def __init__(self) -> None:
        self.heads: list[dict[str, str]] = []
        self.port = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")[1:]
                pairs = (line.split(": ", 1) for line in lines if line)
                headers = {name.lower(): value for name, value in pairs}
                await reader.readexactly(int(headers.get("content-length", "0")))
                self.heads.append(headers)
                body = json.dumps({
                    "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "hello"}}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
                }).encode()  # fmt: skip
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%b" % (len(body), body)
                )
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
async def setup() -> AsyncIterator[tuple[Recorder, openai.AsyncOpenAI]]:
    recorder = Recorder()
    server = await asyncio.start_server(recorder.handle, "127.0.0.1", 0)
    recorder.port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{recorder.port}"
    config: dict[str, Any] = {
        "server": {"port": 0},
        "tenants": [{"name": "t", "keys": [CLIENT_KEY], "limits": {"tokens_per_minute": 1000}}],
        "pools": [{"model": "m", "health_check": {"enabled": False},
                   "engine_metrics": {"enabled": False},
                   "backends": [{"url": url, "api_key": BACKEND_KEY}]}],
    }  # fmt: skip
    running = await start_gateway(parse_config(config))
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{running.port}/v1", api_key=CLIENT_KEY, max_retries=0
    )
    yield recorder, client
    await client.close()
    await running.close()  # closes its connections: each handler sees the end and returns
    await asyncio.wait(recorder.tasks, timeout=5)
    server.close()


async def test_the_backend_gets_its_own_key_never_the_clients(
    setup: tuple[Recorder, openai.AsyncOpenAI],
) -> None:
    recorder, client = setup
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    (head,) = recorder.heads
    assert head["authorization"] == f"Bearer {BACKEND_KEY}"
    assert all(CLIENT_KEY not in value for value in head.values())


async def test_the_tenant_is_charged_what_the_engine_says_it_used(
    setup: tuple[Recorder, openai.AsyncOpenAI],
) -> None:
    _, client = setup
    messages = [{"role": "user", "content": "x"}]
    first = await client.chat.completions.with_raw_response.create(
        model="m",
        messages=messages,
        max_tokens=500,  # type: ignore[arg-type]
    )
    reserved = 1000 - int(first.headers["x-ratelimit-remaining-tokens"])
    assert reserved > 500  # the prompt's estimate and max_tokens
    second = await client.chat.completions.with_raw_response.create(
        model="m",
        messages=messages,
        max_tokens=500,  # type: ignore[arg-type]
    )
    # The first was settled at its usage (12 tokens): what is left is 1000 - 12 - reserved,
    # plus the little the bucket refilled in between.
    left = int(second.headers["x-ratelimit-remaining-tokens"])
    assert 1000 - 12 - reserved <= left <= 1000 - 12 - reserved + 20
