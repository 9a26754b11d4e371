"""A client's key stays at the gateway; each backend gets its own; the tokens a tenant is
charged are the engine's `usage`; engine-steering fields reach the engine only from tenants
allowed them. Over a recording upstream on a real socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from fleetgate.http.client import HttpClient, Origin
from tests.gateway.recording import Recorder, recorded_gateway

CLIENT_KEY, BACKEND_KEY = "sk-client-secret-key", "backend-secret"
ENGINE_KEY = "sk-engine-fields-key"


@pytest.fixture
async def setup() -> AsyncIterator[tuple[Recorder, openai.AsyncOpenAI]]:
    config: dict[str, Any] = {
        "tenants": [
            {"name": "t", "keys": [CLIENT_KEY], "limits": {"tokens_per_minute": 1000}},
            {"name": "pd", "keys": [ENGINE_KEY], "engine_fields": True},
        ],
    }
    pricing = {"input_per_1m_usd": 1000, "output_per_1m_usd": 2000}
    async with recorded_gateway(config, {"pricing": pricing}, {"api_key": BACKEND_KEY}) as (
        recorder,
        running,
    ):
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{running.port}/v1", api_key=CLIENT_KEY, max_retries=0
        )
        yield recorder, client
        await client.close()


async def test_the_backend_gets_its_own_key_never_the_clients(
    setup: tuple[Recorder, openai.AsyncOpenAI],
) -> None:
    recorder, client = setup
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    (head,) = recorder.heads
    assert head["authorization"] == f"Bearer {BACKEND_KEY}"
    assert all(CLIENT_KEY not in value for value in head.values())


async def test_the_tenant_is_charged_what_the_engine_says_it_used(
    setup: tuple[Recorder, openai.AsyncOpenAI],
) -> None:
    _, client = setup
    messages = [{"role": "user", "content": "x"}]
    first = await client.chat.completions.with_raw_response.create(
        model="m",
        messages=messages,
        max_tokens=500,  # type: ignore[arg-type]
    )
    reserved = 1000 - int(first.headers["x-ratelimit-remaining-tokens"])
    assert reserved > 500  # the prompt's estimate and max_tokens
    second = await client.chat.completions.with_raw_response.create(
        model="m",
        messages=messages,
        max_tokens=500,  # type: ignore[arg-type]
    )
    # The first was settled at its usage (12 tokens): what is left is 1000 - 12 - reserved,
    # plus the little the bucket refilled in between.
    left = int(second.headers["x-ratelimit-remaining-tokens"])
    assert 1000 - 12 - reserved <= left <= 1000 - 12 - reserved + 20


async def test_engine_steering_fields_reach_the_engine_only_from_tenants_allowed_them(
    setup: tuple[Recorder, openai.AsyncOpenAI],
) -> None:
    recorder, client = setup
    steer = {"kv_transfer_params": {"remote_host": "10.9.9.9", "remote_port": 1},
             "bootstrap_host": "10.9.9.9", "priority": -100}  # fmt: skip
    messages = [{"role": "user", "content": "say kv_transfer_params"}]
    await client.chat.completions.create(model="m", messages=messages, extra_body=steer)  # type: ignore[arg-type]
    allowed = openai.AsyncOpenAI(base_url=client.base_url, api_key=ENGINE_KEY, max_retries=0)
    await allowed.chat.completions.create(model="m", messages=messages, extra_body=steer)  # type: ignore[arg-type]
    await allowed.close()
    stripped, kept = recorder.bodies
    assert "kv_transfer_params" not in stripped and "bootstrap_host" not in stripped
    assert "priority" not in stripped  # no jumping an engine's priority queue
    assert stripped["messages"] == messages  # the rest as the client sent it
    assert kept["kv_transfer_params"] == steer["kv_transfer_params"]


async def test_each_tenants_tokens_and_spend_are_counted_from_the_engines_usage(
    setup: tuple[Recorder, openai.AsyncOpenAI],
) -> None:
    _, client = setup
    for _ in range(2):
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=50
        )
    http = HttpClient()
    origin = Origin.parse(str(client.base_url).removesuffix("/v1/"))
    text = (await (await http.request(origin, b"GET", b"/metrics", [])).read()).decode()
    await http.close()
    # usage 7 + 5 per request at 1000 and 2000 USD per million: 0.017 USD each
    assert 'fleetgate_tokens_total{kind="prompt",model="m",tenant="t"} 14.0' in text
    assert 'fleetgate_tokens_total{kind="completion",model="m",tenant="t"} 10.0' in text
    spend = next(line for line in text.splitlines() if line.startswith("fleetgate_spend_usd_total"))
    assert 'tenant="t"' in spend and float(spend.rsplit(" ", 1)[1]) == pytest.approx(0.034)


async def test_a_limited_tenant_sees_the_gateways_rate_limit_headers_not_the_backends(
    setup: tuple[Recorder, openai.AsyncOpenAI],
) -> None:
    _, client = setup
    messages = [{"role": "user", "content": "x"}]
    limited = await client.chat.completions.with_raw_response.create(model="m", messages=messages)
    assert limited.headers.get_list("x-ratelimit-remaining-tokens") != ["99"]
    assert len(limited.headers.get_list("x-ratelimit-remaining-tokens")) == 1  # ours alone
    assert "x-ratelimit-limit-requests" not in limited.headers  # the tenant has no such limit
    unlimited = openai.AsyncOpenAI(base_url=client.base_url, api_key=ENGINE_KEY, max_retries=0)
    passed = await unlimited.chat.completions.with_raw_response.create(model="m", messages=messages)
    await unlimited.close()
    assert passed.headers.get_list("x-ratelimit-remaining-tokens") == ["99"]  # the backend's
