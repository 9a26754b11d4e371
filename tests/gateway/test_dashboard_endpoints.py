"""The dashboard's endpoints on a started gateway over a sim worker (in-process, real sockets):
the admin key (as a browser sends it, too), the snapshot, the event stream, and a drain that
the open streams do not hold up; each region's traffic and the gateway's region failing over
(two sims in two regions, one drained)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import openai

from fleetgate.config import parse_config
from fleetgate.http.client import HttpClient, Origin
from fleetgate.running import RunningGateway, start_gateway

ADMIN, TENANT = "sk-dashboard-admin-key", "sk-dashboard-tenant-key"


def basic(password: str, user: str = "admin") -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def get(
    port: int, path: bytes, authorization: str | None = None
) -> tuple[int, dict[bytes, bytes], bytes]:
    http = HttpClient()
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    try:
        response = await http.request(
            Origin.parse(f"http://127.0.0.1:{port}"), b"GET", path, headers
        )
        body = await response.read()
        return response.status, {k.lower(): v for k, v in response.headers}, body
    finally:
        await http.close()


async def started(backends: list[dict[str, Any]] | None = None, **server: Any) -> RunningGateway:
    config: Any = parse_config({
        "server": {"port": 0, **server},
        "auth": {"admin_keys": [ADMIN]},
        "tenants": [{"name": "gold", "keys": [TENANT]}],
        "pools": [{"model": "m", "backends": backends or [{"sim": "h100-llama3-8b"}],
                   "slo": {"ttft_s": 2.0}}],
    })  # fmt: skip
    return await start_gateway(config)


async def ask(port: int, times: int) -> None:
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key=TENANT, max_retries=0
    )
    try:
        for _ in range(times):  # streamed: a stream has a TTFT
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                stream=True,
            )  # fmt: skip
            async for _chunk in stream:
                pass
    finally:
        await client.close()


async def test_the_dashboard_needs_the_admin_key_and_a_browser_is_asked_for_it() -> None:
    running = await started()
    try:
        status, headers, _ = await get(running.port, b"/dashboard")
        assert status == 401
        assert headers[b"www-authenticate"].startswith(b"Basic realm=")
        for wrong in (basic(TENANT), basic("nope"), "Basic !!notbase64", basic(ADMIN, user="")[:9]):
            assert (await get(running.port, b"/dashboard/snapshot", wrong))[0] == 401
        status, headers, page = await get(running.port, b"/dashboard", basic(ADMIN))
        assert status == 200
        assert headers[b"content-type"].startswith(b"text/html")
        assert b"script-src 'self'" in headers[b"content-security-policy"]
        assert b"frame-ancestors 'none'" in headers[b"content-security-policy"]
        assert b"/dashboard/app.js" in page
        for asset in (b"app.js", b"style.css", b"uPlot.iife.min.js", b"uPlot.min.css"):
            status, _, body = await get(running.port, b"/dashboard/" + asset, f"Bearer {ADMIN}")
            assert status == 200 and body, asset
        # Only the listed files: nothing else of the package or the disk can be asked for.
        for path in (b"/dashboard/../config.py", b"/dashboard/uPlot.LICENSE", b"/dashboard/x"):
            assert (await get(running.port, path, basic(ADMIN)))[0] == 404
    finally:
        await running.close()


async def test_the_snapshot_shows_every_backend_the_tenants_and_the_seconds() -> None:
    running = await started()
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{running.port}/v1", api_key=TENANT, max_retries=0
    )
    try:
        for _ in range(3):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
        await asyncio.sleep(1.1)  # the second of those requests is over
        status, _, body = await get(running.port, b"/dashboard/snapshot", basic(ADMIN))
        assert status == 200
        snapshot = json.loads(body)
        (pool,) = snapshot["pools"]
        (backend,) = pool["backends"]
        states = running.pools["m"].states
        assert (pool["model"], backend["id"]) == ("m", states[0].backend.id)
        assert (backend["verdict"], backend["flags"], backend["role"]) == ("healthy", [], "decode")
        assert pool["admission"]["limit"] > 0
        assert [o["name"] for o in pool["slo"]] == ["ttft_p99"]
        assert snapshot["tenants"] == [{"tenant": "gold", "requests": 3, "prompt_tokens": 0,
                                        "completion_tokens": 0, "spend_usd": 0.0}]  # fmt: skip
        assert sum(p["requests"] for p in snapshot["points"]) == 3
        assert sum(p["ok"] for p in snapshot["points"]) == 3
        assert abs(snapshot["time"] - time.time()) < 5
    finally:
        await client.close()
        await running.close()


async def test_each_region_shows_its_traffic_and_the_gateways_region_its_failover() -> None:
    running = await started(
        [{"sim": "h100-llama3-8b", "labels": {"region": "eu"}},
         {"sim": "h100-llama3-8b", "labels": {"region": "us"}}],
        region="eu", admin=True,
    )  # fmt: skip
    try:
        await ask(running.port, 2)  # kept in eu, the gateway's region
        http = HttpClient()
        try:  # a drill: eu's one backend drains, the region is down, its traffic goes to us
            response = await http.request(
                Origin.parse(f"http://127.0.0.1:{running.port}"), b"POST",
                b"/admin/regions/eu/drain", [(b"authorization", f"Bearer {ADMIN}".encode())],
            )  # fmt: skip
            assert response.status == 200, await response.read()
            await response.read()
        finally:
            await http.close()
        await ask(running.port, 3)
        await asyncio.sleep(1.1)  # the second of those requests is over
        for wrong in (None, basic(TENANT)):
            assert (await get(running.port, b"/dashboard/regions", wrong))[0] == 401
        status, headers, body = await get(running.port, b"/dashboard/regions", basic(ADMIN))
        assert status == 200 and headers[b"content-type"] == b"application/json"
        view = json.loads(body)
        assert 1 <= view["window_s"] <= 5 and view["latency_window_s"] == view["window_s"]
        eu, us = view["regions"]
        assert (eu["region"], eu["backends"], eu["requests"], eu["errors"]) == ("eu", 1, 2, 0)
        assert (us["region"], us["backends"], us["requests"], us["errors"]) == ("us", 1, 3, 0)
        assert eu["requests_per_s"] == 2 / view["window_s"] and eu["error_rate"] == 0.0
        assert 0 < us["ttft_p50"] <= us["ttft_p99"] <= us["e2e_p99"]
        (local,) = eu["local"]
        assert (local["model"], local["phase"], local["keep"]) == ("m", "down", 0.0)
        assert (local["failovers"], local["spilled"]) == (1, 0)
        assert local["last_failover_s"] is not None and local["last_failover_s"] >= 0
        assert us["local"] == []
        _, _, body = await get(running.port, b"/dashboard/snapshot", basic(ADMIN))
        shown = json.loads(body)["regions"]["regions"]  # the page's, refreshed with the rest
        assert [(r["region"], r["requests"], r["local"]) for r in shown] == [
            (r["region"], r["requests"], r["local"]) for r in view["regions"]]  # fmt: skip
    finally:
        await running.close()


async def test_without_region_labels_requests_are_not_counted_by_region() -> None:
    # (a fleet with no region anywhere pays nothing a request for the table)
    running = await started()
    try:
        await ask(running.port, 2)
        await asyncio.sleep(1.1)
        _, _, body = await get(running.port, b"/dashboard/regions", basic(ADMIN))
        (row,) = json.loads(body)["regions"]
        assert (row["region"], row["backends"], row["requests"], row["local"]) == ("", 1, 0, [])
    finally:
        await running.close()


async def test_the_event_stream_sends_snapshots_and_ends_when_the_gateway_drains() -> None:
    running = await started()
    reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
    try:
        writer.write(
            b"GET /dashboard/events HTTP/1.1\r\nHost: gw\r\nAuthorization: "
            + basic(ADMIN).encode() + b"\r\n\r\n"
        )  # fmt: skip
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert b"200" in head.split(b"\r\n")[0] and b"text/event-stream" in head
        seen: list[dict[str, Any]] = []
        while len(seen) < 2:
            line = await asyncio.wait_for(reader.readline(), 5)
            if line.startswith(b"data: "):
                seen.append(json.loads(line[6:]))
        assert seen[0]["pools"][0]["model"] == "m"
        began = time.monotonic()
        left = await running.drain(10.0)  # the stream ends at once: no wait for its timeout
        assert left == 0
        assert time.monotonic() - began < 3.0
    finally:
        writer.close()


async def test_the_dashboard_off_is_not_served() -> None:
    running = await started(dashboard=False)
    try:
        assert (await get(running.port, b"/dashboard", basic(ADMIN)))[0] == 404
    finally:
        await running.close()


async def test_at_most_32_live_views_are_open_at_once() -> None:
    running = await started()
    writers = []
    try:
        for _ in range(33):
            reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
            writer.write(b"GET /dashboard/events HTTP/1.1\r\nHost: gw\r\nAuthorization: "
                         + basic(ADMIN).encode() + b"\r\n\r\n")  # fmt: skip
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            writers.append(writer)
        assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 5" in head.lower()
        writers[0].close()  # one leaves: a place for the next
        await asyncio.sleep(1.2)  # its stream notices at its next snapshot
        reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
        writer.write(b"GET /dashboard/events HTTP/1.1\r\nHost: gw\r\nAuthorization: "
                     + basic(ADMIN).encode() + b"\r\n\r\n")  # fmt: skip
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writers.append(writer)
        assert head.startswith(b"HTTP/1.1 200")
    finally:
        for writer in writers:
            writer.close()
        await running.close()
