"""What the operator turns on and off: /metrics, and the request log's file, on a started
gateway over a sim worker (in-process, real sockets)."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import openai
import pytest

from fleetgate.config import ConfigError, parse_config
from fleetgate.http.client import HttpClient, Origin
from fleetgate.running import start_gateway


def config(**sections: Any) -> Any:
    return parse_config({
        "server": {"port": 0, **sections.pop("server", {})},
        "pools": [{"model": "m", "backends": [{"sim": "h100-llama3-8b"}]}],
        **sections,
    })  # fmt: skip


async def get(port: int, path: bytes) -> int:
    http = HttpClient()
    try:
        response = await http.request(Origin.parse(f"http://127.0.0.1:{port}"), b"GET", path, [])
        await response.read()
        return response.status
    finally:
        await http.close()


async def test_metrics_off_serves_no_metrics_and_still_serves_requests(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    running = await start_gateway(config(server={"metrics": False}, request_log={"path": str(log)}))
    try:
        assert await get(running.port, b"/metrics") == 404
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{running.port}/v1", api_key="x", max_retries=0
        )
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        await client.close()
        assert reply.choices[0].message.content
    finally:
        await running.close()  # writes the lines still waiting
    (line,) = [json.loads(x) for x in log.read_text().splitlines()]
    assert (line["status"], line["model"], line["tenant"]) == (200, "m", "anonymous")


async def test_the_request_log_off_writes_nothing_and_metrics_are_served(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    running = await start_gateway(config(request_log={"enabled": False, "path": str(log)}))
    try:
        assert await get(running.port, b"/metrics") == 200
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{running.port}/v1", api_key="x", max_retries=0
        )
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        await client.close()
    finally:
        await running.close()
    assert not log.exists()


async def test_an_unwritable_request_log_stops_the_start_before_any_sim_is_started(
    tmp_path: Path,
) -> None:
    path = tmp_path / "missing" / "requests.jsonl"
    with pytest.raises(ConfigError, match=r"request_log\.path"):
        await start_gateway(config(request_log={"path": str(path)}))
    assert multiprocessing.active_children() == []  # the pool's sim was never started
