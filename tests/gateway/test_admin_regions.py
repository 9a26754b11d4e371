"""Region drills through the admin API: POST /admin/regions/{name}/drain moves a region's
traffic out gracefully (its backends drain, and one that joins it later too), undrain brings
it back, GET /admin/regions says where each stands; the admin key, the audit log and bad
paths as for every admin endpoint. In-process sims and gateway, real sockets, the SDK."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai

from fleetgate.config import parse_config
from fleetgate.http.client import HttpClient, Origin
from fleetgate.running import start_gateway
from tests.gateway.test_admin_api import ADMIN, TENANT, call, served, sims


@asynccontextmanager
async def regional(ports: list[int], audit: Path) -> AsyncIterator[int]:
    """A gateway over sims in eu-west (the first) and us-east (the others)."""
    regions = ["eu-west", *["us-east"] * (len(ports) - 1)]
    config: Any = parse_config({
        "server": {"port": 0, "admin": True, "dashboard": False, "audit_log": str(audit)},
        "auth": {"admin_keys": [ADMIN]},
        "tenants": [{"name": "gold", "keys": [TENANT]}],
        "request_log": {"enabled": False},
        "pools": [{"model": "m", "policy": "round_robin", "backends": [
            {"url": f"http://127.0.0.1:{p}", "labels": {"region": r}}
            for p, r in zip(ports, regions, strict=True)]}],
    })  # fmt: skip
    running = await start_gateway(config)
    try:
        yield running.port
    finally:
        await running.close()


async def scrape(port: int) -> tuple[int, str]:
    http = HttpClient()
    try:
        response = await http.request(Origin.parse(f"http://127.0.0.1:{port}"), b"GET",
                                      b"/metrics", [])  # fmt: skip
        return response.status, (await response.read()).decode()
    finally:
        await http.close()


async def ask(port: int, times: int) -> None:
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=TENANT,
                                max_retries=0)  # fmt: skip
    for _ in range(times):
        await client.completions.create(model="m", prompt="x", max_tokens=1)
    await client.close()


async def test_a_region_drill_moves_its_traffic_out_and_back(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    async with sims(3) as (eu, us, joiner), regional([eu, us], audit) as port:
        status, rows = await call(port, b"GET", b"/admin/regions")
        assert status == 200 and [(r["region"], r["backends"], r["drained"]) for r in rows] == [
            ("eu-west", 1, False), ("us-east", 1, False)]  # fmt: skip

        status, rows = await call(port, b"POST", b"/admin/regions/eu-west/drain")
        assert status == 200 and rows[0] == {
            "region": "eu-west",
            "drained": True,
            "backends": 1,
            "healthy": 0,
            "draining": 1,
        }
        before = await served(eu)
        await ask(port, 4)
        assert await served(eu) == before  # all went to us-east

        # A backend that joins a drained region drains too.
        joining = {"model": "m", "url": f"http://127.0.0.1:{joiner}",
                   "labels": {"region": "eu-west"}}  # fmt: skip
        status, _ = await call(port, b"POST", b"/admin/backends", joining)
        assert status == 201
        _, rows = await call(port, b"GET", b"/admin/regions")
        assert rows[0]["backends"] == 2 and rows[0]["draining"] == 2

        status, rows = await call(port, b"POST", b"/admin/regions/eu-west/undrain")
        assert status == 200 and rows[0]["drained"] is False and rows[0]["draining"] == 0
        await ask(port, 6)
        assert await served(eu) > before

        status, text = await scrape(port)
        assert (
            f'fleetgate_backend_info{{backend="127.0.0.1:{eu}",model="m",region="eu-west",'
            'zone=""} 1.0' in text
        )

        lines = [json.loads(line) for line in audit.read_text().splitlines()]
        drills = [(x["region"], x["draining"], x["backends"]) for x in lines
                  if x["event"] == "admin_region_drain"]  # fmt: skip
        assert drills == [("eu-west", True, 1), ("eu-west", False, 2)]


async def test_a_drill_needs_the_admin_key_and_a_well_formed_path(tmp_path: Path) -> None:
    async with sims(1) as (eu,), regional([eu], tmp_path / "audit.jsonl") as port:
        status, body = await call(port, b"POST", b"/admin/regions/eu-west/drain", key=TENANT)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        status, body = await call(port, b"POST", b"/admin/regions/eu-west/evacuate")
        assert status == 404 and "drain or /undrain" in body["error"]["message"]
        status, body = await call(port, b"POST", b"/admin/regions/eu%2Fwest/drain")
        assert status == 404
        status, body = await call(port, b"GET", b"/admin/regions/eu-west/drain")
        assert status == 405
        _, rows = await call(port, b"GET", b"/admin/regions")
        assert rows[0]["drained"] is False  # nothing was drained by any of those
