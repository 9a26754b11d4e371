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

from fleetgate.gateway.app import send_error
from fleetgate.http.server import Request, ResponseWriter, start_server

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


async def handle(request: Request, writer: ResponseWriter) -> None:
    if request.method == b"GET":
        writer.send(200, [(b"content-type", b"application/json")], MODELS)
        return
    if b'"stream":true' not in request.body.replace(b" ", b""):
        writer.send(200, [(b"content-type", b"application/json")], BODY)
        return
    writer.start(200, [(b"content-type", b"text/event-stream")])
    gap = STREAM_SECONDS / (STREAM_CHUNKS - 1)
    for i in range(STREAM_CHUNKS):
        if i:
            await asyncio.sleep(gap)
        writer.write(CHUNK)
    writer.write(b"data: [DONE]\n\n")
    writer.end()


async def serve(host: str, port: int, ready: asyncio.Event | None = None) -> None:
    server = await start_server(handle, send_error, host, port)
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
