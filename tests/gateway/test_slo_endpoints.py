"""A pool's objectives on a started gateway over a sim worker (in-process, real sockets): the
burn rates and alerts on /metrics and GET /admin/slo, and refusals counted in their pool."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from fleetgate.config import parse_config
from fleetgate.http.client import HttpClient, Origin
from fleetgate.running import start_gateway

KEY, ADMIN = "sk-slo-test-key", "sk-slo-admin-key"


async def get(port: int, path: bytes, key: str | None = None) -> tuple[int, bytes]:
    http = HttpClient()
    headers = [] if key is None else [(b"authorization", f"Bearer {key}".encode())]
    try:
        origin = Origin.parse(f"http://127.0.0.1:{port}")
        response = await http.request(origin, b"GET", path, headers)
        return response.status, await response.read()
    finally:
        await http.close()


def sample(text: bytes, name: str, **labels: str) -> float | None:
    """The value of the series `name{labels}` in a Prometheus text page (None: absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.decode().splitlines():
        if line.startswith(name + "{"):
            head, value = line.rsplit(" ", 1)
            got = ",".join(sorted(head[len(name) + 1 : -1].split(",")))
            if got == wanted:
                return float(value)
    return None


async def test_objectives_burn_alerts_and_refusals_in_their_pool_are_served() -> None:
    config: Any = parse_config({
        "server": {"port": 0, "admin": True},
        "auth": {"admin_keys": [ADMIN]},
        "tenants": [{"name": "t", "keys": [KEY], "limits": {"requests_per_minute": 4}}],
        "pools": [{"model": "m", "backends": [{"sim": "h100-llama3-8b"}],
                   "slo": {"e2e_s": 1e-6, "ttft_s": 30.0, "availability": 0.99}}],
    })  # fmt: skip
    running = await start_gateway(config)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{running.port}/v1", api_key=KEY, max_retries=0
    )
    try:
        for stream in (False, False, True, True):
            reply = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                stream=stream,
            )  # fmt: skip
            if stream:
                async for _ in reply:  # type: ignore[union-attr]
                    pass
        with pytest.raises(openai.RateLimitError):  # the fifth in the minute: its own limit
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
        assert (await get(running.port, b"/admin/slo"))[0] == 401
        status, body = await get(running.port, b"/admin/slo", ADMIN)
        assert status == 200
        objectives = {o["name"]: o for o in json.loads(body)["m"]}
        ttft, e2e = objectives["ttft_p99"], objectives["e2e_p99"]
        available = objectives["availability"]
        assert (ttft["requests"], ttft["value"], ttft["met"]) == (2, 1.0, True)
        # No answer comes in a microsecond: every one is bad, the budget burns 100x.
        assert (e2e["requests"], e2e["value"], e2e["met"]) == (4, 0.0, False)
        assert e2e["burn"]["5m"] == pytest.approx(100.0)
        assert e2e["alerts"] == ["page", "ticket"]
        # The 429 was the client's own limit: not the service's failure, not counted.
        assert (available["requests"], available["value"]) == (4, 1.0)
        _, text = await get(running.port, b"/metrics")
        labels = {"model": "m", "objective": "e2e_p99"}
        assert sample(text, "fleetgate_slo_alert", severity="page", **labels) == 1.0
        assert sample(text, "fleetgate_slo_burn_rate", window="1h", **labels) == pytest.approx(100)
        assert sample(text, "fleetgate_slo_requests_total", verdict="bad", **labels) == 4.0
        assert sample(text, "fleetgate_slo_met", model="m", objective="ttft_p99") == 1.0
        assert sample(text, "fleetgate_slo_target", model="m", objective="availability") == 0.99
        # The refusal is counted in its pool (the pool's name, never the client's string).
        assert sample(text, "fleetgate_requests_total", model="m", backend="none",
                      status="429") == 1.0  # fmt: skip
    finally:
        await client.close()
        await running.close()
