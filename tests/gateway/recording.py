"""A recording upstream on a real socket, and a gateway with keys in front of it: what the
gateway tests that look at what reaches an engine share."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fleetgate.config import parse_config
from fleetgate.running import RunningGateway, start_gateway


class Recorder:
    """An OpenAI-compatible upstream that answers every chat with 5 completion tokens (and
    rate-limit headers of its own, as a provider's API does) and keeps each request's
    headers."""

    def __init__(self) -> None:
        self.heads: list[dict[str, str]] = []
        self.bodies: list[dict[str, Any]] = []
        self.port = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.decode().split("\r\n")
                pairs = (line.split(": ", 1) for line in lines if line)
                headers = {name.lower(): value for name, value in pairs}
                sent = await reader.readexactly(int(headers.get("content-length", "0")))
                if request_line.startswith("POST "):  # not the gateway's probes of the engine
                    self.heads.append(headers)
                try:
                    if request_line.startswith("POST "):
                        self.bodies.append(json.loads(sent))
                except ValueError:  # a form upload, passed through as it came
                    self.bodies.append({"raw": sent.decode("latin-1")})
                body = json.dumps({
                    "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "hello"}}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
                }).encode()  # fmt: skip
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"x-ratelimit-limit-requests: 5000\r\nx-ratelimit-remaining-tokens: 99\r\n"
                    b"content-length: %d\r\n\r\n%b" % (len(body), body)
                )
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@asynccontextmanager
async def recorded_gateway(
    config: dict[str, Any],
    pool: dict[str, Any] | None = None,
    backend: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[Recorder, RunningGateway]]:
    """A gateway on a free port (`config`: its tenants and anything else) with one pool, `m`,
    of one backend, a Recorder (`pool`, `backend`: more of their fields; health checks and
    engine metrics off)."""
    recorder = Recorder()
    server = await asyncio.start_server(recorder.handle, "127.0.0.1", 0)
    recorder.port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{recorder.port}"
    full: dict[str, Any] = {
        "server": {"port": 0}, **config,
        "pools": [{"model": "m", "health_check": {"enabled": False},
                   "engine_metrics": {"enabled": False}, **(pool or {}),
                   "backends": [{"url": url, **(backend or {})}]}],
    }  # fmt: skip
    running = await start_gateway(parse_config(full))
    try:
        yield recorder, running
    finally:
        await running.close()  # closes its connections: each handler sees the end and returns
        if recorder.tasks:
            await asyncio.wait(recorder.tasks, timeout=5)
        server.close()
