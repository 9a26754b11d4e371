"""A small OpenAI-compatible server on a real socket, for the runner's and command's tests.

It streams `max_tokens` filler tokens as chunked SSE, then a usage chunk and [DONE]; its
`mode` makes it fail in the ways the load generator must record. Any other path is a 404 (it
has no /metrics: it is no fleetgate gateway).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

Mode = Literal["ok", "status_503", "hang", "error_event"]


class FakeOpenAI:
    def __init__(self) -> None:
        self.mode: Mode = "ok"
        self.port = 0
        self.requests: list[dict[str, Any]] = []
        self.not_found: list[str] = []  # paths asked for that it does not serve
        self.release = asyncio.Event()
        self.got_request = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.decode().split("\r\n")
                headers = dict(line.lower().split(": ", 1) for line in lines if line)
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                await self.respond(request_line.split(" ")[1], body, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def respond(self, path: str, body: bytes, writer: asyncio.StreamWriter) -> None:
        if path == "/v1/models":
            send_json(writer, 200, {"object": "list", "data": [{"id": "sim-model"}]})
            return
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self.not_found.append(path)
            send_json(writer, 404, {"error": {"message": f"no {path}"}})
            return
        request = json.loads(body)
        self.requests.append(request)
        self.got_request.set()
        if self.mode == "hang":
            await self.release.wait()
            raise ConnectionError("released")
        if self.mode == "status_503":
            send_json(writer, 503, {"error": {"message": "overloaded"}})
            return
        chat = path == "/v1/chat/completions"
        n = request["max_tokens"]
        if not request.get("stream"):
            choice = {"message": {"content": " tok" * n}} if chat else {"text": " tok" * n}
            send_json(writer, 200, {"choices": [choice], "usage": {"completion_tokens": n}})
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        events: list[dict[str, Any]] = (
            [{"choices": [{"delta": {"role": "assistant"}}]}] if chat else []
        )
        if self.mode == "error_event":
            events.append({"error": {"message": "engine died"}})
        for _ in range(n):
            events.append(
                {"choices": [{"delta": {"content": " tok"}} if chat else {"text": " tok"}]}
            )
        events.append({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n}})
        for event in events:
            write_chunk(writer, b"data: " + json.dumps(event).encode() + b"\n\n")
            await writer.drain()
        write_chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    def close_all(self) -> None:
        self.release.set()
        for writer in list(self._writers):
            writer.close()


def write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


def send_json(writer: asyncio.StreamWriter, status: int, doc: dict[str, Any]) -> None:
    body = json.dumps(doc).encode()
    writer.write(
        b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (status, len(body), body)
    )


async def start_fake_openai() -> tuple[FakeOpenAI, asyncio.Server]:
    fake = FakeOpenAI()
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    fake.port = server.sockets[0].getsockname()[1]
    return fake, server
