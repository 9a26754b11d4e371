"""The Batch API in a gateway started in-process over a recording upstream, with the openai
SDK: a batch's requests go the gateway's own way (the tenant's limits, the batch lane), and a
tenant sees only its own files and batches."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types import Batch

from fleetgate.running import RunningGateway
from tests.gateway.recording import Recorder, recorded_gateway

ALICE, BOB = "sk-alice-batches-key", "sk-bob-batches-key"
CHAT = "/v1/chat/completions"


def jsonl(count: int, **extra: Any) -> bytes:
    lines = (
        {"custom_id": f"req-{i}", "method": "POST", "url": CHAT,
         "body": {"model": "m", "messages": [{"role": "user", "content": f"{i}"}], **extra}}
        for i in range(count)
    )  # fmt: skip
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


class Setup:
    def __init__(self, recorder: Recorder, running: RunningGateway) -> None:
        self.recorder = recorder
        self.running = running
        base = f"http://127.0.0.1:{running.port}/v1"
        self.alice = openai.AsyncOpenAI(base_url=base, api_key=ALICE, max_retries=0)
        self.bob = openai.AsyncOpenAI(base_url=base, api_key=BOB, max_retries=0)

    async def raw(self, method: str, path: str) -> tuple[int, bytes]:
        """A request sent byte for byte as written (no client normalising its path)."""
        status, _, body = await self.raw_answer(method, path)
        return status, body

    async def raw_answer(self, method: str, path: str) -> tuple[int, dict[bytes, bytes], bytes]:
        """`raw`'s answer with its headers (names lowercased)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.running.port)
        writer.write(f"{method} {path} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {ALICE}\r\n"
                     "connection: close\r\n\r\n".encode())  # fmt: skip
        answer = await reader.read()
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        status_line, *lines = head.split(b"\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(b":") for h in lines)}
        return int(status_line.split()[1]), headers, body


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    config: dict[str, Any] = {
        "request_log": {"enabled": False},
        "tenants": [{"name": "alice", "keys": [ALICE], "limits": {"tokens_per_minute": 10**6}},
                    {"name": "bob", "keys": [BOB]}],
        "batches": {"dir": str(tmp_path / "batches"), "max_files_per_tenant": 3},
    }  # fmt: skip
    async with recorded_gateway(config, {"engine_priority": True}) as (recorder, running):
        setup = Setup(recorder, running)
        yield setup
        await setup.alice.close()
        await setup.bob.close()


async def ended(client: openai.AsyncOpenAI, batch_id: str) -> Batch:
    """Poll the batch as a client does until it has ended."""
    for _ in range(500):
        batch = await client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        await asyncio.sleep(0.01)
    raise AssertionError(f"batch still {batch.status}")


async def test_a_batch_runs_as_its_tenant_on_the_batch_lane(setup: Setup) -> None:
    file = await setup.alice.files.create(file=("in.jsonl", jsonl(5, stream=True)),
                                          purpose="batch")  # fmt: skip
    assert (file.purpose, file.bytes, file.filename, file.status) == (
        "batch", len(jsonl(5, stream=True)), "in.jsonl", "processed")  # fmt: skip
    created = await setup.alice.batches.create(
        input_file_id=file.id, endpoint=CHAT, completion_window="24h", metadata={"job": "t"}
    )
    assert created.status == "in_progress" and created.metadata == {"job": "t"}
    batch = await ended(setup.alice, created.id)
    assert batch.status == "completed" and batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (5, 5)
    assert batch.usage is not None and batch.usage.output_tokens == 25
    assert batch.output_file_id is not None and batch.error_file_id is None
    content = await setup.alice.files.content(batch.output_file_id)
    lines = [json.loads(line) for line in content.text.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == [f"req-{i}" for i in range(5)]
    assert all(line["response"]["status_code"] == 200 for line in lines)
    assert lines[0]["response"]["body"]["choices"][0]["message"]["content"] == "hello"
    # The engine saw each as a batch-lane request (priority 3), never streamed.
    assert [(b["priority"], b["stream"]) for b in setup.recorder.bodies] == [(3, False)] * 5
    assert all(ALICE not in json.dumps(head) for head in setup.recorder.heads)
    # Its tokens are the tenant's, as any request's.
    _, metrics = await setup.raw("GET", "/metrics")
    assert b'fleetgate_tokens_total{kind="completion",model="m",tenant="alice"} 25.0' in metrics
    listed = await setup.alice.batches.list(limit=5)
    assert [b.id for b in listed.data] == [batch.id]
    output = await setup.alice.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output" and output.bytes == len(content.content)


async def test_another_tenant_finds_none_of_them(setup: Setup) -> None:
    file = await setup.alice.files.create(file=("in.jsonl", jsonl(1)), purpose="batch")
    batch = await setup.alice.batches.create(
        input_file_id=file.id, endpoint=CHAT, completion_window="24h"
    )
    for ask in (setup.bob.batches.retrieve(batch.id), setup.bob.batches.cancel(batch.id),
                setup.bob.files.retrieve(file.id), setup.bob.files.content(file.id),
                setup.bob.files.delete(file.id)):  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            await ask
    assert (await setup.bob.batches.list()).data == []
    assert (await setup.bob.files.list()).data == []
    with pytest.raises(openai.BadRequestError) as info:
        await setup.bob.batches.create(input_file_id=file.id, endpoint=CHAT,
                                       completion_window="24h")  # fmt: skip
    assert info.value.body["param"] == "input_file_id"  # type: ignore[index]
    await ended(setup.alice, batch.id)
    deleted = await setup.alice.files.delete(file.id)
    assert deleted.deleted and (await setup.alice.files.list()).data[0].purpose == "batch_output"


@pytest.mark.parametrize(
    "path",
    ["/v1/files/..%2F..%2Fetc%2Fpasswd/content", "/v1/files/../../etc/passwd",
     "/v1/batches/%2e%2e", "/v1/files/file-x/content/more", "/v1/batches/x/other",
     "/v1/files/file-x/"],
)  # fmt: skip
async def test_a_path_that_is_not_an_id_is_not_found(setup: Setup, path: str) -> None:
    status, body = await setup.raw("GET", path)
    assert status == 404 and b"passwd" not in body


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("POST", "/v1/files/file-x/content", b"GET"), ("PUT", "/v1/files/file-x", b"GET, DELETE"),
     ("DELETE", "/v1/batches/batch_x", b"GET"), ("GET", "/v1/batches/batch_x/cancel", b"POST")],
)  # fmt: skip
async def test_a_method_a_path_does_not_take_is_405_with_the_methods_it_does(
    setup: Setup, method: str, path: str, allowed: bytes
) -> None:
    status, headers, body = await setup.raw_answer(method, path)
    assert status == 405 and headers[b"allow"] == allowed
    error = json.loads(body)["error"]
    assert error["code"] == "method_not_allowed" and allowed.decode() in error["message"]
    assert set(error) >= {"message", "type", "param", "code"}


async def test_uploads_are_bounded_and_say_what_to_change(setup: Setup) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await setup.alice.files.create(file=("a.jsonl", b"{}\n"), purpose="fine-tune")
    assert "purpose=batch" in info.value.message
    for _ in range(3):
        await setup.alice.files.create(file=("a.jsonl", b"{}\n"), purpose="batch")
    with pytest.raises(openai.BadRequestError) as info:
        await setup.alice.files.create(file=("a.jsonl", b"{}\n"), purpose="batch")
    assert info.value.code == "too_many_files" and "max_files_per_tenant" in info.value.message
    status, _ = await setup.raw("DELETE", "/v1/batches/batch_x")
    assert status == 405


async def test_a_file_with_a_bad_line_fails_its_batch_with_the_line(setup: Setup) -> None:
    again = {"custom_id": "req-0", "method": "POST", "url": CHAT, "body": {"model": "m"}}
    data = jsonl(2) + json.dumps(again).encode() + b"\n"
    file = await setup.alice.files.create(file=("in.jsonl", data), purpose="batch")
    batch = await setup.alice.batches.create(
        input_file_id=file.id, endpoint=CHAT, completion_window="24h"
    )
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data
    error = batch.errors.data[0]
    assert (error.code, error.line, error.param) == ("duplicate_custom_id", 3, "custom_id")
    assert setup.recorder.bodies == []


async def test_a_file_s_content_is_streamed_in_chunks(setup: Setup) -> None:
    data = jsonl(3000)  # a few hundred KiB: more than one chunk
    assert len(data) > 256 * 1024
    file = await setup.alice.files.create(file=("in.jsonl", data), purpose="batch")
    status, body = await setup.raw("GET", f"/v1/files/{file.id}/content")
    assert status == 200
    chunks, rest = [], body
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if not size:
            break
        chunks.append(rest[:size])
        rest = rest[size + 2 :]
    assert len(chunks) > 1 and b"".join(chunks) == data
    assert (await setup.alice.files.content(file.id)).content == data  # as the SDK reads it
