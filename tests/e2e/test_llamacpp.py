"""fleetgate in front of two real engines: llama.cpp's own server (xllamacpp) with the packaged
Gemma 3 270M model, on this machine's CPU, driven with the official openai SDK.

The model is a base model: its answers are real tokens but mostly nonsense, and it rarely ends
on its own, so answers run to max_tokens. With temperature 0 they are deterministic.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.procs import (
    Proc,
    gateway,
    get,
    llamacpp_servers,
    metric,
    stream_killing,
    streamed_chat,
)

MODEL = "gemma-3-270m"
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 7}


def _config(path: Path, urls: list[str]) -> Path:
    config = {
        "server": {"admin": True},
        "pools": [{
            "model": MODEL, "policy": "least_requests",
            "backends": [{"url": u} for u in urls],  # engine: auto (recognised by probing)
            "health_check": {"interval_s": 0.5},
            "engine_metrics": {"interval_s": 0.2},
            "retries": {"max_attempts": 2},
        }],
    }  # fmt: skip
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    with llamacpp_servers(2, MODEL) as engines:
        urls = [url for url, _ in engines]
        config = _config(tmp_path_factory.mktemp("llama") / "gw.yaml", urls)
        with gateway(["--config", str(config)]) as (url, _):
            _wait_recognised(url, len(urls))
            yield url, urls


@pytest.fixture(scope="module")
def client(fleet: tuple[str, list[str]]) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet[0] + "/v1", api_key="unused", max_retries=0)


def _backends(url: str) -> list[dict[str, Any]]:
    listing: list[dict[str, Any]] = json.loads(get(url + "/admin/backends")[2])
    return listing


def _wait_recognised(url: str, count: int) -> None:
    deadline = time.monotonic() + 20
    while [b["kind"] for b in _backends(url)] != ["llamacpp"] * count:
        assert time.monotonic() < deadline, _backends(url)
        time.sleep(0.1)


def test_each_engine_is_recognised_and_its_real_metrics_read(
    client: openai.OpenAI, fleet: tuple[str, list[str]]
) -> None:
    url, engines = fleet
    assert all(b["kind"] == "llamacpp" and b["verdict"] == "healthy" for b in _backends(url))
    done = threading.Event()

    def long_answer() -> None:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Write."}], max_tokens=60,
            **GREEDY,
        )  # fmt: skip
        done.set()

    worker = threading.Thread(target=long_answer)
    worker.start()
    try:
        running = 0.0
        deadline = time.monotonic() + 10
        while running < 1 and not done.is_set() and time.monotonic() < deadline:
            # llamacpp:requests_processing, scraped from the engine serving it.
            running = sum(
                metric(url, "fleetgate_backend_engine_running_requests", backend=e[7:])
                for e in engines
            )
            time.sleep(0.05)
        assert running == 1
    finally:
        worker.join(20)


def test_chat_and_completions_streaming_and_not_with_usage(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, **GREEDY
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 6
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True,
        stream_options={"include_usage": True}, **GREEDY,
    )  # fmt: skip
    text, completion = streamed_chat(stream)
    assert text == reply.choices[0].message.content  # greedy: the same answer
    assert completion == 6
    done = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=5, **GREEDY)
    assert done.choices[0].text and done.usage is not None and done.usage.completion_tokens == 5
    pieces = client.completions.create(
        model=MODEL, prompt="The sea is", max_tokens=5, stream=True, **GREEDY
    )
    assert "".join(c.choices[0].text for c in pieces if c.choices) == done.choices[0].text


def test_stop_sequences_end_the_answer(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=12, **GREEDY
    )
    text = whole.choices[0].message.content or ""
    assert "\n" in text  # this model breaks lines early
    cut = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=12, stop=["\n"],
        **GREEDY,
    )  # fmt: skip
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text.split("\n")[0]


def test_an_engine_s_error_reaches_the_client_in_openai_s_shape_and_blames_no_one(
    client: openai.OpenAI, fleet: tuple[str, list[str]]
) -> None:
    url = fleet[0]
    with pytest.raises(openai.BadRequestError) as info:  # over the 2,048-token context
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "word " * 5000}], max_tokens=4
        )
    assert "context" in str(info.value.message).lower()
    assert all(b["verdict"] == "healthy" for b in _backends(url))  # the client's mistake


def test_the_responses_api_through_the_gateway(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, temperature=0)
    assert response.output_text and response.usage is not None
    # llama.cpp's events lack output_index and content_index, which the SDK's stream helper
    # (`responses.stream`) needs; the events themselves read well.
    events = client.responses.create(
        model=MODEL, input="Hi", max_output_tokens=4, temperature=0, stream=True
    )
    kinds, deltas = [], []
    for event in events:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "".join(deltas) == response.output_text


def test_an_engine_killed_mid_stream_is_continued_on_the_other(tmp_path: Path) -> None:
    with llamacpp_servers(2, MODEL) as engines:
        urls = [u for u, _ in engines]
        with gateway(["--config", str(_config(tmp_path / "gw.yaml", urls))]) as (url, _):
            _wait_recognised(url, 2)
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            stream = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Write a story."}],
                max_tokens=48, stream=True, stream_options={"include_usage": True}, **GREEDY,
            )  # fmt: skip
            # SIGKILL: the engine is gone mid-answer.
            ids, completion = stream_killing(stream, 8, lambda: _busy(engines).stop(9))
            assert len(ids) == 1 and completion == 48
            assert metric(url, "fleetgate_stream_continuations_total") == 1


def _busy(engines: list[tuple[str, Proc]]) -> Proc:
    """The engine generating an answer now (llama.cpp's own metrics say which)."""
    for url, proc in engines:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        if "llamacpp:requests_processing 1" in text:
            return proc
    raise AssertionError("no engine is busy")
