"""A pool whose engines schedule by priority gets each request's class as its `priority`,
whatever the client wrote there. Over a recording upstream on a real socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from tests.gateway.recording import Recorder, recorded_gateway

KEYS = {"gold": "sk-gold-priority-key", "bronze": "sk-bronze-priority-key",
        "bulk": "sk-bulk-priority-key"}  # fmt: skip


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[Recorder, str]]:
    config: dict[str, Any] = {
        "request_log": {"enabled": False},
        "tenants": [
            {"name": "gold", "keys": [KEYS["gold"]], "priority": "critical"},
            {"name": "bronze", "keys": [KEYS["bronze"]], "priority": "sheddable"},
            {"name": "bulk", "keys": [KEYS["bulk"]], "batch": True},
        ],
    }
    async with recorded_gateway(config, {"engine_priority": True}) as (recorder, running):
        yield recorder, f"http://127.0.0.1:{running.port}/v1"


async def test_each_request_reaches_the_engine_with_its_class_as_priority(
    gateway: tuple[Recorder, str],
) -> None:
    recorder, url = gateway
    sent = [("gold", {}), ("gold", {"x-fleetgate-priority": "standard"}), ("bronze", {}),
            ("bulk", {})]  # fmt: skip
    for tenant, headers in sent:
        client = openai.AsyncOpenAI(base_url=url, api_key=KEYS[tenant], max_retries=0)
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}],
            extra_body={"priority": -5}, extra_headers=headers,
        )  # fmt: skip
        await client.close()
    # critical 0, standard 1, sheddable 2, the batch lane after all: 3. The client's -5 never.
    assert [body["priority"] for body in recorder.bodies] == [0, 1, 2, 3]
    assert all(body["messages"] == [{"role": "user", "content": "x"}] for body in recorder.bodies)


async def test_a_form_upload_goes_as_it_came_with_no_priority_written_into_it(
    gateway: tuple[Recorder, str],
) -> None:
    recorder, url = gateway
    client = openai.AsyncOpenAI(base_url=url, api_key=KEYS["gold"], max_retries=0)
    raw = await client.audio.transcriptions.with_raw_response.create(
        model="m", file=("a.wav", b"RIFF" + bytes(range(256)))
    )
    await client.close()
    assert raw.http_request.headers["content-type"].startswith("multipart/form-data")
    assert raw.status_code == 200  # it was a 500, the form read as JSON to add `priority`
    assert "raw" in recorder.bodies[-1] and "priority" not in recorder.bodies[-1]["raw"]
