"""`fleetgate top`, a real process reading a started gateway (in-process, real sockets)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from fleetgate.config import parse_config
from fleetgate.serve import start_gateway

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
