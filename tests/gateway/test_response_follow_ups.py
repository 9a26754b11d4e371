"""A stored Response is its tenant's: another tenant naming its id is told there is none, and
the tenant's own follow-up is routed to the backend that keeps it. Over a recording upstream
on a real socket, with keys on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from fleetgate.config import parse_config
from fleetgate.serve import start_gateway
from tests.gateway.test_credentials import Recorder

KEYS = {"a": "sk-tenant-a-follow-up", "b": "sk-tenant-b-follow-up"}


@pytest.fixture
async def url() -> AsyncIterator[tuple[Recorder, str]]:
    recorder = Recorder()  # answers every POST with a body whose id is "c1"
    server = await asyncio.start_server(recorder.handle, "127.0.0.1", 0)
    recorder.port = server.sockets[0].getsockname()[1]
    config: dict[str, Any] = {
        "server": {"port": 0},
        "request_log": {"enabled": False},
        "tenants": [{"name": n, "keys": [k]} for n, k in KEYS.items()],
        "pools": [{"model": "m", "health_check": {"enabled": False},
                   "engine_metrics": {"enabled": False},
                   "backends": [{"url": f"http://127.0.0.1:{recorder.port}"}]}],
    }  # fmt: skip
    running = await start_gateway(parse_config(config))
    yield recorder, f"http://127.0.0.1:{running.port}/v1"
    await running.close()
    await asyncio.wait(recorder.tasks, timeout=5)
    server.close()


async def test_another_tenant_cannot_follow_up_a_response(url: tuple[Recorder, str]) -> None:
    recorder, base = url
    alice = openai.AsyncOpenAI(base_url=base, api_key=KEYS["a"], max_retries=0)
    bob = openai.AsyncOpenAI(base_url=base, api_key=KEYS["b"], max_retries=0)
    first = await alice.responses.with_raw_response.create(model="m", input="hi")
    assert first.status_code == 200  # its id, "c1", noted as alice's
    again = await alice.responses.with_raw_response.create(
        model="m", input="and?", previous_response_id="c1"
    )
    assert again.status_code == 200 and len(recorder.bodies) == 2
    with pytest.raises(openai.NotFoundError) as info:
        await bob.responses.create(model="m", input="tell me", previous_response_id="c1")
    assert info.value.code == "not_found" and len(recorder.bodies) == 2  # never sent on
    await alice.close()
    await bob.close()
