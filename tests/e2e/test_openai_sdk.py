"""The official openai SDK against a real gateway in front of real sim workers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.procs import gateway, get, metric, sim_workers, write_config

MODEL = "sim-8b"
EMBED_MODEL = "sim-8b-b"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    with sim_workers(MODEL, 2) as workers, sim_workers(EMBED_MODEL, 1, "a100-llama3-8b") as other:
        config = write_config(
            tmp_path_factory.mktemp("gw") / "gw.yaml", {MODEL: workers, EMBED_MODEL: other}
        )
        with gateway(["--config", str(config)]) as (url, _):
            yield url, workers


@pytest.fixture(scope="module")
def client(fleet: tuple[str, list[str]]) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet[0] + "/v1", api_key="unused", max_retries=0)


def test_chat_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=12
    )
    assert reply.model == MODEL
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 12
    assert reply.usage.prompt_tokens > 0
    assert len(reply.choices[0].message.content or "") > 12


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count."}],
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, usage, ids = [], None, set()
    for chunk in stream:
        ids.add(chunk.id)
        if chunk.choices and chunk.choices[0].delta.content:
            texts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert len(texts) == 20
    assert len(ids) == 1
    assert usage is not None and usage.completion_tokens == 20


def test_completions(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=7)
    assert reply.choices[0].text
    assert reply.usage is not None and reply.usage.completion_tokens == 7
    streamed = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=5, stream=True
    )
    assert sum(1 for c in streamed if c.choices and c.choices[0].text) == 5


def test_embeddings(client: openai.OpenAI) -> None:
    result = client.embeddings.create(model=EMBED_MODEL, input=["a", "b"])
    assert [d.index for d in result.data] == [0, 1]
    assert len(result.data[0].embedding) > 0


def test_models_is_the_union_of_the_fleet(client: openai.OpenAI) -> None:
    assert sorted(m.id for m in client.models.list()) == [MODEL, EMBED_MODEL]


def test_unknown_model_is_a_404_that_lists_the_known_ones(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    assert MODEL in str(info.value) and info.value.code == "model_not_found"


def test_requests_spread_over_the_pool_and_show_in_metrics(
    client: openai.OpenAI, fleet: tuple[str, list[str]]
) -> None:
    url, workers = fleet
    for _ in range(32):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    per_backend = [metric(url, "fleetgate_requests_total", backend=w[7:]) for w in workers]
    assert all(n >= 3 for n in per_backend), per_backend  # round robin: at least 3 each
    assert metric(url, "fleetgate_request_duration_seconds_count", model=MODEL) >= 32
    assert metric(url, "fleetgate_backend_in_flight_requests") == 0
    assert metric(url, "fleetgate_backend_pending_prefill_tokens") == 0
    assert metric(url, "fleetgate_backend_in_flight_tokens") == 0
    timed = metric(url, "fleetgate_routing_plugin_seconds_count", plugin="round_robin")
    assert timed >= 2  # one pick in 16 is timed


def test_health_and_readiness(fleet: tuple[str, list[str]]) -> None:
    url = fleet[0]
    assert get(url + "/healthz")[0] == 200
    assert get(url + "/readyz")[0] == 200


def test_request_id_is_echoed_or_made(fleet: tuple[str, list[str]], tmp_path: Path) -> None:
    import urllib.request

    body = b'{"model": "sim-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}'
    request = urllib.request.Request(
        fleet[0] + "/v1/chat/completions",
        data=body,
        headers={"content-type": "application/json", "x-request-id": "abc-123"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["x-request-id"] == "abc-123"
    status, headers, _ = get(fleet[0] + "/v1/models")
    assert status == 200 and headers.get("x-request-id")


def test_every_exported_series_is_documented_and_every_documented_one_exported(
    fleet: tuple[str, list[str]],
) -> None:
    _, _, body = get(fleet[0] + "/metrics")
    exported = set(re.findall(r"^# HELP (fleetgate_\w+)", body.decode(), re.MULTILINE))
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(fleetgate_\w+)`", docs, re.MULTILINE))
    assert exported == documented
