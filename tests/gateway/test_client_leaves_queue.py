"""A client that leaves while its request waits for admission: the request still ends with a
Finished (499, client_closed) for every subscriber, so nothing kept for it leaks (the tracer's
open spans, the request log's entry) and the metrics count it."""

from __future__ import annotations

import asyncio
from typing import Any

import openai

from fleetgate.config import parse_config
from fleetgate.http.client import HttpClient, Origin
from fleetgate.running import start_gateway

SAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_leaving_the_admission_queue_finishes_the_request_for_every_subscriber() -> None:
    config: Any = parse_config({
        "server": {"port": 0},
        "tracing": {"enabled": True, "sample": 0.0, "endpoint": "http://127.0.0.1:9/v1/traces"},
        "pools": [{"model": "m", "backends": [{"sim": "h100-llama3-8b"}],
                   "admission": {"limit": {"max_in_flight": 1}}}],
    })  # fmt: skip
    running = await start_gateway(config)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{running.port}/v1", api_key="x", max_retries=0
    )
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}'
    try:
        holder = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hold"}],  # type: ignore[list-item]
            max_tokens=2000, stream=True,
        )  # fmt: skip
        leavers = []
        for _ in range(5):  # queued behind the holder, each with a sampled trace, then gone
            _, writer = await asyncio.open_connection("127.0.0.1", running.port)
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\ncontent-type: "
                b"application/json\r\ntraceparent: %b\r\ncontent-length: %d\r\n\r\n%b"
                % (SAMPLED.encode(), len(body), body)
            )
            await writer.drain()
            leavers.append(writer)
        await asyncio.sleep(0.3)  # they wait: the only place is the holder's
        tracing = running._tracing
        assert tracing is not None and tracing.open_requests == 5
        for writer in leavers:
            writer.close()
        for _ in range(50):
            if tracing.open_requests == 0:
                break
            await asyncio.sleep(0.05)
        assert tracing.open_requests == 0
        await holder.close()
        http = HttpClient()
        response = await http.request(
            Origin.parse(f"http://127.0.0.1:{running.port}"), b"GET", b"/metrics", []
        )
        text = (await response.read()).decode()
        await http.close()
        assert 'fleetgate_requests_total{backend="none",model="m",status="499"} 5.0' in text
    finally:
        await client.close()
        await running.close()
