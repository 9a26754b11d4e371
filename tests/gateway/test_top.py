"""`fleetgate top`, a real process reading a started gateway (in-process, real sockets)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from fleetgate.config import parse_config
from fleetgate.running import start_gateway

ADMIN = "sk-top-admin-key"


async def top(*args: str) -> tuple[int, str]:
    env = {**os.environ, "COLUMNS": "160", "FLEETGATE_ADMIN_KEY": ""}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fleetgate", "top", "--once", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode()


async def test_top_shows_every_backend_and_objective_and_says_what_it_lacks() -> None:
    config: Any = parse_config({
        "server": {"port": 0},
        "auth": {"admin_keys": [ADMIN]},
        "tenants": [{"name": "t", "keys": ["sk-top-tenant-key"]}],
        "pools": [{"model": "m", "slo": {"availability": 0.99},
                   "backends": [{"sim": "h100-llama3-8b", "labels": {"region": "eu-west"}},
                                {"sim": "a100-llama3-8b"}]}],
    })  # fmt: skip
    running = await start_gateway(config)
    try:
        target = f"http://127.0.0.1:{running.port}"
        code, out = await top("--target", target, "--key", ADMIN)
        assert code == 0, out
        for state in running.pools["m"].states:
            assert state.backend.id in out
        assert "region=eu-west" in out
        assert out.count("healthy") == 2
        assert "availability" in out
        code, out = await top("--target", target)
        assert code == 1, out
        assert "needs its admin key" in out
    finally:
        await running.close()
    code, out = await top("--target", target, "--key", ADMIN)
    assert (code, "cannot reach the gateway" in out) == (1, True)


def test_names_from_the_config_are_shown_as_text_never_read_as_markup() -> None:
    from rich.console import Console

    from fleetgate.observe.top import render

    backend = {"name": "n[/b]", "id": "127.0.0.1:1", "role": "decode", "verdict": "healthy",
               "flags": [], "ejected_for_s": None, "engine": None, "in_flight": 0,
               "ttft_s": None, "labels": {"zone": "[/x]"}}  # fmt: skip
    snapshot = {
        "time": 0, "uptime_s": 1, "points": [], "events": [],
        "tenants": [{"tenant": "[red]t[/x]", "requests": 1, "prompt_tokens": 0,
                     "completion_tokens": 0, "spend_usd": 0.0}],
        "pools": [{"model": "m[/x]", "admission": None, "slo": [], "backends": [backend]}],
    }  # fmt: skip
    console = Console(record=True, width=160)
    console.print(render(snapshot))  # rich raised MarkupError on "[/x]"
    text = console.export_text()
    assert "[red]t[/x]" in text and "zone=[/x]" in text and "m[/x]" in text
