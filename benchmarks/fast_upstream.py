"""A fast stand-in upstream for the overhead benchmark: answers instantly, so what is measured
through the gateway is the gateway.

POST with `"stream": true` answers 21 SSE chunks paced over 200 ms (what a real engine's stream
looks like to a proxy); any other POST answers a small chat-completion JSON at once.

    python benchmarks/fast_upstream.py --port 9001
"""

from __future__ import annotations

import argparse
import asyncio

import uvloop

from fleetgate.http.server import Handler, Request, start_server
from fleetgate.http.writer import ResponseWriter
from fleetgate.openai_api import send_error

BODY = (
    b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"fast",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,'
    b'"total_tokens":6}}'
)
CHUNK = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"fast",'
    b'"choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}]}\n\n'
)
MODELS = b'{"object":"list","data":[{"id":"fast","object":"model","created":1,"owned_by":"x"}]}'
STREAM_CHUNKS = 21
STREAM_SECONDS = 0.2


class _Stream:
    __slots__ = ("done", "sent")

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.sent = 1
        self.done = done


class Pacer:
    """Writes the next chunk of every open stream on one shared 10 ms tick.

    One timer for all streams instead of one per stream per chunk keeps this upstream cheap
    enough that the benchmark measures the proxy, not the stand-in.
    """

    def __init__(self) -> None:
        self._streams: dict[ResponseWriter, _Stream] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, writer: ResponseWriter) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        writer.write(CHUNK)
        self._streams[writer] = _Stream(done)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return done

    async def _run(self) -> None:
        gap = STREAM_SECONDS / (STREAM_CHUNKS - 1)
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while True:
            next_tick += gap
            await asyncio.sleep(max(0.0, next_tick - loop.time()))
            finished = []
            for writer, stream in self._streams.items():
                if not writer.disconnected:
                    writer.write(CHUNK)
                    stream.sent += 1
                if writer.disconnected or stream.sent == STREAM_CHUNKS:
                    finished.append(writer)
            for writer in finished:
                done = self._streams.pop(writer).done
                if not done.done():  # cancelled when its client went away
                    done.set_result(None)


def make_handler(pacer: Pacer) -> Handler:
    async def handle(request: Request, writer: ResponseWriter) -> None:
        if request.method == b"GET":
            writer.send(200, [(b"content-type", b"application/json")], MODELS)
            return
        if b'"stream":true' not in request.body.replace(b" ", b""):
            writer.send(200, [(b"content-type", b"application/json")], BODY)
            return
        writer.start(200, [(b"content-type", b"text/event-stream")])
        await pacer.add(writer)
        writer.write(b"data: [DONE]\n\n")
        writer.end()

    return handle


async def serve(host: str, port: int) -> None:
    server = await start_server(make_handler(Pacer()), send_error, host, port)
    print(f"fast upstream on http://{host}:{server.port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9001)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
