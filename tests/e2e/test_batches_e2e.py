"""The Batch API end to end: a real gateway process over sim workers, driven by the openai
SDK. A batch of chat requests answered once each, a bad line failing its batch, a cancel,
tenants kept apart, and a gateway killed mid-batch whose successor, on the same directory,
finishes it with every request answered exactly once."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from openai.types import Batch

from tests.e2e.procs import fleetgate, gateway, metric
from tests.redis_server import RedisServer

MODEL = "sim-8b"
CHAT = "/v1/chat/completions"
LEASE = "fleetgate_shared_lease_held"
KEYS = {"alice": "sk-alice-e2e-batches", "bob": "sk-bob-e2e-batches"}


@pytest.fixture(scope="module")
def workers() -> Iterator[list[str]]:
    """Two sim workers that take 0.2 s more per request: a batch lasts long enough to stop."""
    args = ["worker", "sim", "--port", "0", "--model", MODEL, "--replicas", "2",
            "--added-latency", "0.2"]  # fmt: skip
    with fleetgate(args) as proc:
        ports = proc.wait_for(r"on http://127\.0\.0\.1:(\d+)", 2)
        yield [f"http://127.0.0.1:{p}" for p in ports]


def write_config(path: Path, workers: list[str], batches: Path, concurrency: int) -> Path:
    config = {
        "request_log": {"enabled": False},
        "tenants": [{"name": name, "keys": [key]} for name, key in KEYS.items()],
        "pools": [{"model": MODEL, "backends": [{"url": u} for u in workers]}],
        "batches": {"dir": str(batches), "concurrency": concurrency},
    }
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, workers: list[str]) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("batches")
    config = write_config(folder / "gw.json", workers, folder / "state", 4)
    with gateway(["--config", str(config)]) as (base, _):
        yield base


def client(url: str, tenant: str = "alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEYS[tenant], max_retries=0)


def requests(count: int) -> bytes:
    lines = (
        {"custom_id": f"q{i}", "method": "POST", "url": CHAT,
         "body": {"model": MODEL, "max_tokens": 8,
                  "messages": [{"role": "user", "content": f"Question {i}?"}]}}
        for i in range(count)
    )  # fmt: skip
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def start(sdk: openai.OpenAI, data: bytes) -> Batch:
    file = sdk.files.create(file=("requests.jsonl", data), purpose="batch")
    return sdk.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h")


def wait(sdk: openai.OpenAI, batch_id: str, until: Callable[[Batch], bool]) -> Batch:
    """Poll the batch, as a client of the Batch API does, until `until` holds."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        batch = sdk.batches.retrieve(batch_id)
        if until(batch):
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} still {batch.status}: {batch.request_counts}")


def done(batch: Batch) -> bool:
    return batch.status in ("completed", "failed", "cancelled", "expired")


def completed(batch: Batch) -> int:
    return 0 if batch.request_counts is None else batch.request_counts.completed


def answers(sdk: openai.OpenAI, batch: Batch) -> list[dict[str, object]]:
    assert batch.output_file_id is not None
    text = sdk.files.content(batch.output_file_id).text
    return [json.loads(line) for line in text.splitlines()]


def test_a_batch_of_chats_is_answered_once_each(url: str) -> None:
    sdk = client(url)
    batch = wait(sdk, start(sdk, requests(20)).id, done)
    assert batch.status == "completed" and batch.error_file_id is None
    assert batch.request_counts is not None and batch.request_counts.completed == 20
    lines = answers(sdk, batch)
    assert sorted(str(line["custom_id"]) for line in lines) == sorted(f"q{i}" for i in range(20))
    for line in lines:
        response = line["response"]
        assert isinstance(response, dict) and response["status_code"] == 200
        assert response["body"]["choices"][0]["message"]["content"]
        assert 0 < response["body"]["usage"]["completion_tokens"] <= 8


def test_a_bad_line_fails_the_batch_with_its_line(url: str) -> None:
    bad = {"custom_id": "q1", "method": "GET", "url": CHAT, "body": {"model": MODEL}}
    batch = start(client(url), requests(1) + json.dumps(bad).encode() + b"\n")
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data
    assert [(e.code, e.line) for e in batch.errors.data] == [("invalid_method", 2)]


def test_a_cancelled_batch_keeps_what_was_answered(url: str) -> None:
    sdk = client(url)
    batch = start(sdk, requests(20))
    assert sdk.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    batch = wait(sdk, batch.id, done)
    assert batch.status == "cancelled" and batch.request_counts is not None
    assert batch.request_counts.completed < 20
    if batch.request_counts.completed:
        assert len(answers(sdk, batch)) == batch.request_counts.completed


def test_another_tenant_cannot_see_a_batch(url: str) -> None:
    batch = start(client(url), requests(1))
    bob = client(url, "bob")
    with pytest.raises(openai.NotFoundError):
        bob.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        bob.files.content(batch.input_file_id)
    assert bob.batches.list().data == []


def test_a_gateway_killed_mid_batch_is_finished_by_the_next(
    tmp_path: Path, workers: list[str]
) -> None:
    # One request at a time, 0.2 s each or more: 20 take some 5 s.
    config = write_config(tmp_path / "gw.json", workers, tmp_path / "state", 1)
    with gateway(["--config", str(config)]) as (base, first):
        sdk = client(base)
        batch = start(sdk, requests(20))
        counts = wait(sdk, batch.id, lambda b: completed(b) >= 3).request_counts
        first.stop(signal.SIGKILL)
    assert counts is not None and counts.completed < 20
    with gateway(["--config", str(config)]) as (base, _):
        sdk = client(base)
        batch = wait(sdk, batch.id, done)
        assert batch.status == "completed" and batch.error_file_id is None
        ids = [str(line["custom_id"]) for line in answers(sdk, batch)]
    assert sorted(ids) == sorted(f"q{i}" for i in range(20))  # each exactly once


def test_two_gateways_on_one_directory_run_a_batch_once_through_the_runners_death(
    tmp_path: Path, workers: list[str], own_redis: RedisServer
) -> None:
    """Made at the gateway that does not run the batches, shown there as it runs at the other,
    and finished by it once the other is killed and its lease (2 s) has lapsed."""
    config = write_config(tmp_path / "gw.json", workers, tmp_path / "state", 1)
    settings = json.loads(config.read_text())
    settings["state"] = {"url": own_redis.url}
    settings["batches"]["lease_s"] = 2.0
    config.write_text(json.dumps(settings))
    with gateway(["--config", str(config)]) as first, gateway(["--config", str(config)]) as second:
        held = {url: metric(url, LEASE, lease="batches") for url, _ in (first, second)}
        assert sorted(held.values()) == [0.0, 1.0]  # the first to start took the lease
        (_, runner), (other_url, _) = sorted((first, second), key=lambda g: -held[g[0]])
        sdk = client(other_url)
        batch = start(sdk, requests(20))
        counts = wait(sdk, batch.id, lambda b: completed(b) >= 3).request_counts
        runner.stop(signal.SIGKILL)
        assert counts is not None and counts.completed < 20
        batch = wait(sdk, batch.id, done)
        assert metric(other_url, LEASE, lease="batches") == 1.0
        assert batch.status == "completed" and batch.error_file_id is None
        ids = [str(line["custom_id"]) for line in answers(sdk, batch)]
    assert sorted(ids) == sorted(f"q{i}" for i in range(20))  # each exactly once
