"""A stored Response is its tenant's: another tenant naming its id is told there is none, and
the tenant's own follow-up is routed to the backend that keeps it. Over a recording upstream
on a real socket, with keys on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from tests.gateway.recording import Recorder, recorded_gateway

KEYS = {"a": "sk-tenant-a-follow-up", "b": "sk-tenant-b-follow-up"}


@pytest.fixture
async def url() -> AsyncIterator[tuple[Recorder, str]]:
    config: dict[str, Any] = {
        "request_log": {"enabled": False},
        "tenants": [{"name": n, "keys": [k]} for n, k in KEYS.items()],
    }
    # The recorder answers every POST with a body whose id is "c1".
    async with recorded_gateway(config) as (recorder, running):
        yield recorder, f"http://127.0.0.1:{running.port}/v1"


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
