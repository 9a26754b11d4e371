"""/metrics after known traffic on a started gateway over a sim worker (in-process, real
sockets, the official SDK): exact counts per tenant, class and outcome, and labels that stay
bounded whatever a client sends."""

from __future__ import annotations

import re
import secrets
from typing import Any

import openai
import pytest

from fleetgate.config import parse_config
from fleetgate.http.client import HttpClient, Origin
from fleetgate.running import start_gateway

KEY_A, KEY_B = "sk-metrics-tenant-a", "sk-metrics-tenant-b"
SAMPLE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")


async def scrape(port: int) -> str:
    http = HttpClient()
    try:
        response = await http.request(
            Origin.parse(f"http://127.0.0.1:{port}"), b"GET", b"/metrics", []
        )
        return (await response.read()).decode()
    finally:
        await http.close()


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            name, labels, value = match.groups()
            pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            out.append((name, pairs, float(value)))
    return out


def total(text: str, name: str, **labels: str) -> float:
    """The sum over the series of `name` whose labels include `labels`."""
    return sum(
        value
        for n, pairs, value in samples(text)
        if n == name and all(pairs.get(k) == v for k, v in labels.items())
    )


async def test_known_traffic_is_counted_exactly_and_client_strings_never_become_labels() -> None:
    config: Any = parse_config({
        "server": {"port": 0},
        "tenants": [
            {"name": "a", "keys": [KEY_A]},
            {"name": "b", "keys": [KEY_B], "priority": "critical",
             "limits": {"requests_per_minute": 3, "tokens_per_minute": 100_000}},
        ],
        "pools": [{"model": "m", "backends": [{"sim": "h100-llama3-8b"}],
                   "slo": {"availability": 0.99}}],
    })  # fmt: skip
    running = await start_gateway(config)
    base = f"http://127.0.0.1:{running.port}/v1"
    a = openai.AsyncOpenAI(base_url=base, api_key=KEY_A, max_retries=0)
    b = openai.AsyncOpenAI(base_url=base, api_key=KEY_B, max_retries=0)
    stranger = openai.AsyncOpenAI(base_url=base, api_key="sk-" + secrets.token_hex(8),
                                  max_retries=0)  # fmt: skip
    hi = [{"role": "user", "content": "hi"}]
    junk = secrets.token_hex(6)  # must appear nowhere in the metrics
    try:
        for _ in range(3):
            await a.chat.completions.create(
                model="m", messages=hi, max_tokens=3,  # type: ignore[arg-type]
                extra_headers={"x-request-id": f"id-{junk}"},
            )  # fmt: skip
        for _ in range(3):
            stream = await b.chat.completions.create(
                model="m",
                messages=hi,
                max_tokens=3,
                stream=True,  # type: ignore[arg-type]
                stream_options={"include_usage": True},
            )
            async for _ in stream:
                pass
        with pytest.raises(openai.RateLimitError):
            await b.chat.completions.create(model="m", messages=hi, max_tokens=3)  # type: ignore[arg-type]
        with pytest.raises(openai.AuthenticationError):
            await stranger.chat.completions.create(model="m", messages=hi, max_tokens=3)  # type: ignore[arg-type]
        with pytest.raises(openai.NotFoundError):
            await a.chat.completions.create(model=f"model-{junk}", messages=hi)  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError):
            await a.chat.completions.create(
                model="m", messages=hi,  # type: ignore[arg-type]
                extra_headers={"x-fleetgate-priority": f"urgent-{junk}"},
            )  # fmt: skip
        text = await scrape(running.port)
    finally:
        for client in (a, b, stranger):
            await client.close()
        await running.close()

    assert total(text, "fleetgate_admitted_total", model="m", tenant="a", priority="standard") == 3
    assert total(text, "fleetgate_admitted_total", model="m", tenant="b", priority="critical") == 3
    assert total(text, "fleetgate_admitted_total") == 6
    assert total(text, "fleetgate_admission_wait_seconds_count", model="m") == 6
    assert total(text, "fleetgate_requests_total", model="m", status="200") == 6
    assert total(text, "fleetgate_requests_total", model="m", backend="none", status="429") == 1
    assert total(text, "fleetgate_requests_total", model="", status="401") == 1
    assert total(text, "fleetgate_requests_total", model="", status="404") == 1
    assert total(text, "fleetgate_requests_total", model="m", status="400") == 1
    assert total(text, "fleetgate_rejected_total", tenant="b", reason="rate_limit_exceeded") == 1
    assert total(text, "fleetgate_rejected_total", tenant="unknown", reason="invalid_api_key") == 1
    assert total(text, "fleetgate_rejected_total", tenant="a") == 2  # the model, the priority
    assert total(text, "fleetgate_rejected_total") == 4
    # b's tokens are counted (a tokens limit): 3 streams of 3 tokens, as their usage says.
    assert total(text, "fleetgate_tokens_total", tenant="b", kind="completion") == 9
    assert total(text, "fleetgate_backend_state", model="m", state="healthy") == 1
    assert total(text, "fleetgate_backend_flag", model="m", flag="ejected") == 0
    good = total(text, "fleetgate_slo_requests_total", objective="availability", verdict="good")
    assert good == 6

    assert junk not in text
    values = {(k, v) for _, pairs, _ in samples(text) for k, v in pairs.items()}
    assert {v for k, v in values if k == "model"} == {"m", ""}
    assert {v for k, v in values if k == "tenant"} <= {"a", "b", "unknown", "anonymous"}
    assert {v for k, v in values if k == "priority"} <= {
        "critical", "standard", "sheddable", "unknown"
    }  # fmt: skip
