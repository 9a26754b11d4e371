"""The admin API on a started gateway over sim workers (in-process, real sockets): a backend
added at run time takes requests, one removed takes no new ones while its stream finishes,
weights, tenants' use, the config without its secrets, refusals of bad input, the admin key,
and the audit log of every change."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from fleetgate.config import parse_config
from fleetgate.http.client import HttpClient, Origin
from fleetgate.running import RunningGateway, start_gateway
from fleetgate.workers.sim.spec import SimSpec
from fleetgate.workers.sim.worker import SimWorker

ADMIN, TENANT, IDLE = "sk-admin-api-admin-key", "sk-admin-api-tenant-key", "sk-admin-api-idle"
SECRETS = ("sk-admin-api-heartbeat-key", "sk-admin-api-backend-key", "redis-admin-api-password")
ADMIN_ID = hashlib.sha256(ADMIN.encode()).hexdigest()[:16]


async def call(
    port: int, method: bytes, path: bytes, body: object = None, key: str | None = ADMIN
) -> tuple[int, Any]:
    """One request to the gateway: its status and decoded JSON answer."""
    http = HttpClient()
    headers = [(b"content-type", b"application/json")]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        origin = Origin.parse(f"http://127.0.0.1:{port}")
        response = await http.request(origin, method, path, headers, data)
        return response.status, json.loads(await response.read())
    finally:
        await http.close()


async def served(port: int) -> float:
    """Requests a sim worker has finished (its own vllm:request_success_total)."""
    http = HttpClient()
    try:
        response = await http.request(Origin.parse(f"http://127.0.0.1:{port}"), b"GET",
                                      b"/metrics", [])  # fmt: skip
        text = (await response.read()).decode()
    finally:
        await http.close()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


@asynccontextmanager
async def sims(count: int) -> AsyncIterator[list[int]]:
    """`count` sim workers in this process, on free ports."""
    loop = asyncio.get_running_loop()
    workers = [
        SimWorker(SimSpec(model="m", profile="h100-llama3-8b"), random.Random(i), loop)
        for i in range(count)
    ]
    servers = [await w.start("127.0.0.1", 0) for w in workers]
    try:
        yield [s.port for s in servers]
    finally:
        for server, worker in zip(servers, workers, strict=True):
            server.abort()
            await worker.stop()


@asynccontextmanager
async def gateway(port: int, audit: Path, policy: str = "round_robin") -> AsyncIterator[int]:
    """A gateway with the admin API, auth and an audit log over the sim on `port`, its config
    holding a secret of every kind."""
    heartbeat, backend_key, redis_password = SECRETS
    config: Any = parse_config({
        "server": {"port": 0, "admin": True, "dashboard": False, "audit_log": str(audit)},
        "auth": {"admin_keys": [ADMIN], "heartbeat_keys": [heartbeat]},
        "tenants": [{"name": "gold", "keys": [TENANT]}, {"name": "idle", "keys": [IDLE]}],
        "request_log": {"enabled": False},
        "limits": {"redis_url": f"redis://admin:{redis_password}@127.0.0.1:6379/0"},
        "pools": [{"model": "m", "policy": policy, "pricing": {"input_per_1m_usd": 1e6},
                   "backends": [{"url": f"http://127.0.0.1:{port}", "api_key": backend_key}]},
                  {"model": "other", "backends": [{"url": "http://127.0.0.1:9"}],
                   "health_check": {"enabled": False}}],
    })  # fmt: skip
    running: RunningGateway = await start_gateway(config)
    try:
        yield running.port
    finally:
        await running.close()


def chat_client(port: int) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=TENANT,
                              max_retries=0)  # fmt: skip


async def chat(client: openai.AsyncOpenAI) -> None:
    await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_backend_added_takes_requests_and_one_removed_finishes_its_stream_only(
    tmp_path: Path,
) -> None:
    async with sims(2) as (first, second), gateway(first, tmp_path / "audit.jsonl") as port:
        client = chat_client(port)
        joined = f"127.0.0.1:{second}"
        status, view = await call(port, b"POST", b"/admin/backends", {
            "model": "m", "url": f"http://{joined}", "weight": 2, "labels": {"zone": "b"},
        })  # fmt: skip
        assert status == 201
        assert (view["backend"], view["name"], view["labels"]) == (joined, "m#1", {"zone": "b"})
        assert (view["configured_weight"], view["flags"], view["last_pick"]) == (2.0, [], None)
        for _ in range(4):  # round robin: two each
            await chat(client)
        assert (await served(first), await served(second)) == (2, 2)
        status, listing = await call(port, b"GET", b"/admin/backends")
        picked = {b["backend"]: b["last_pick"] for b in listing if b["model"] == "m"}
        assert picked[joined]["kind"] == "first" and picked[joined]["age_s"] >= 0

        # A stream on the joined backend (the first drained meanwhile), then its removal.
        await call(port, b"POST", b"/admin/drain", {"backend": f"127.0.0.1:{first}"})
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "long"}], max_tokens=100,
            stream=True,
        )  # fmt: skip
        chunks = aiter(stream)
        pieces = [await anext(chunks)]  # the stream has begun
        await call(port, b"POST", b"/admin/drain", {"backend": f"127.0.0.1:{first}",
                                                    "draining": False})  # fmt: skip
        status, body = await call(port, b"DELETE", b"/admin/backends?backend=" + joined.encode())
        assert (status, body) == (202, {"backend": joined, "models": ["m"], "in_flight": 1})
        _, listing = await call(port, b"GET", b"/admin/backends")
        (leaving,) = [b for b in listing if b["backend"] == joined]
        assert (leaving["flags"], leaving["leaving"], leaving["in_flight"]) == (
            ["GONE"], True, 1
        )  # fmt: skip
        for _ in range(3):
            await chat(client)
        assert (await served(first), await served(second)) == (5, 2)  # none new went there
        pieces += [c async for c in chunks]
        tokens = [c for c in pieces if c.choices and c.choices[0].delta.content]
        assert len(tokens) == 100  # the stream in flight finished in full
        for _ in range(100):  # it leaves its pool when that request has ended
            _, listing = await call(port, b"GET", b"/admin/backends")
            if all(b["backend"] != joined for b in listing):
                break
            await asyncio.sleep(0.01)
        assert [b["backend"] for b in listing] == [f"127.0.0.1:{first}", "127.0.0.1:9"]
        assert await call(port, b"DELETE", b"/admin/backends?backend=" + joined.encode()) == (
            404, {"error": {"message": f"No backend {joined!r}; GET /admin/backends lists them.",
                            "type": "invalid_request_error", "param": "backend", "code": None}},
        )  # fmt: skip
        await client.close()
        lines = audit_lines(tmp_path / "audit.jsonl")
        changes = [(e["event"], e["key"]) for e in lines if e["event"].startswith("admin_")]
        assert changes == [
            ("admin_backend_added", ADMIN_ID), ("admin_drain", ADMIN_ID),
            ("admin_drain", ADMIN_ID), ("admin_backend_removed", ADMIN_ID),
        ]  # fmt: skip
        added = next(e for e in lines if e["event"] == "admin_backend_added")
        assert (added["backend"], added["model"], added["weight"]) == (joined, "m", 2.0)


async def test_weights_tenants_and_the_config_without_its_secrets(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    async with sims(1) as (first,), gateway(first, audit, policy="balanced") as port:
        backend = f"127.0.0.1:{first}"
        client = chat_client(port)
        for _ in range(3):
            await chat(client)
        await client.close()
        status, listing = await call(port, b"POST", b"/admin/weight",
                                     {"backend": backend, "weight": 3.5})  # fmt: skip
        assert status == 200
        (view,) = [b for b in listing if b["backend"] == backend]
        assert (view["configured_weight"], view["weight"], view["speed"]) == (3.5, 3.5, 1.0)
        assert view["last_pick"]["scores"] == {}  # one candidate: nothing to compare

        status, tenants = await call(port, b"GET", b"/admin/tenants")
        assert status == 200
        gold, idle = tenants
        assert (gold["tenant"], gold["requests"], gold["completion_tokens"]) == ("gold", 3, 6)
        assert gold["prompt_tokens"] > 0 and gold["spend_usd"] == gold["prompt_tokens"]
        assert idle == {"tenant": "idle", "requests": 0, "prompt_tokens": 0,
                        "completion_tokens": 0, "spend_usd": 0.0}  # fmt: skip

        status, config = await call(port, b"GET", b"/admin/config")
        assert status == 200
        text = json.dumps(config)
        for secret in (ADMIN, TENANT, IDLE, *SECRETS):
            assert secret not in text
        assert config["pools"][0]["policy"] == "balanced"
        assert config["auth"]["admin_keys"] == ["<redacted>"]
        events = [e["event"] for e in audit_lines(audit)]
        assert events == ["audit_log_opened", "admin_weight"]  # reads are not written


async def test_scores_of_each_plugin_when_there_is_a_choice(tmp_path: Path) -> None:
    async with sims(2) as (first, second), gateway(first, tmp_path / "a", "balanced") as port:
        await call(
            port, b"POST", b"/admin/backends", {"model": "m", "url": f"http://127.0.0.1:{second}"}
        )
        client = chat_client(port)
        for _ in range(4):
            await chat(client)
        await client.close()
        _, listing = await call(port, b"GET", b"/admin/backends")
        scores = [b["last_pick"]["scores"] for b in listing if b["last_pick"] is not None]
        assert scores and all(
            set(s) == {"prefix_cache", "queue", "prefill_queue", "work_share", "kv_cache"}
            and all(0.0 <= v <= 1.0 for v in s.values()) for s in scores
        )  # fmt: skip


BAD_ADDITIONS = [
    ({"model": "m", "url": "ftp://127.0.0.1:8000"}, 400, "url"),
    ({"model": "m", "url": "127.0.0.1:8000"}, 400, "url"),
    ({"model": "m", "url": "http://127.0.0.1"}, 400, "url"),
    ({"model": "m", "url": "http://u:pw@127.0.0.1:8000"}, 400, "url"),
    ({"model": "m", "url": "http://127.0.0.1:99999"}, 400, "url"),
    ({"model": "m", "sim": "h100-llama3-8b"}, 400, "url"),
    ({"model": "m", "url": "http://127.0.0.1:8000", "weight": 0}, 400, "weight"),
    ({"model": "m", "url": "http://127.0.0.1:8000", "labels": {"a": 1}}, 400, "labels"),
    ({"model": "m", "url": "http://127.0.0.1:8000", "colour": "red"}, 400, "colour"),
    ({"url": "http://127.0.0.1:8000"}, 400, "model"),
    (b"{not json", 400, None),
    ({"model": "nope", "url": "http://127.0.0.1:8000"}, 404, "model"),
]


async def test_bad_input_is_refused_with_a_message_and_changes_nothing(tmp_path: Path) -> None:
    async with sims(1) as (first,), gateway(first, tmp_path / "audit.jsonl") as port:
        for body, status, param in BAD_ADDITIONS:
            got, error = await call(port, b"POST", b"/admin/backends", body)
            assert (got, error["error"]["param"]) == (status, param), body
            assert error["error"]["message"]
        duplicate = {"model": "m", "url": f"http://127.0.0.1:{first}/v1"}  # the same id
        got, error = await call(port, b"POST", b"/admin/backends", duplicate)
        assert got == 409 and "already" in error["error"]["message"]
        backend = f"127.0.0.1:{first}"
        for weight in (0, -1, "3", None, 1e999):
            got, error = await call(port, b"POST", b"/admin/weight",
                                    {"backend": backend, "weight": weight})  # fmt: skip
            assert got == 400 and "weight" in error["error"]["message"], weight
        got, _ = await call(port, b"POST", b"/admin/weight", {"backend": "x:1", "weight": 1})
        assert got == 404
        for path in (b"/admin/backends", b"/admin/backends?model=m"):
            got, error = await call(port, b"DELETE", path)
            assert (got, error["error"]["param"]) == (400, "backend")
        got, error = await call(port, b"PUT", b"/admin/backends")
        assert got == 405 and "DELETE" in error["error"]["message"]
        _, listing = await call(port, b"GET", b"/admin/backends")
        assert [(b["backend"], b["configured_weight"]) for b in listing] == [
            (backend, 1.0), ("127.0.0.1:9", 1.0)
        ]  # fmt: skip
        assert not [e for e in audit_lines(tmp_path / "audit.jsonl")
                    if e["event"].startswith("admin_")]  # fmt: skip


ENDPOINTS = [
    (b"GET", b"/admin/backends", None),
    (b"POST", b"/admin/backends", {"model": "m", "url": "http://127.0.0.1:8000"}),
    (b"DELETE", b"/admin/backends?backend=127.0.0.1:9", None),
    (b"POST", b"/admin/weight", {"backend": "127.0.0.1:9", "weight": 2}),
    (b"POST", b"/admin/drain", {"backend": "127.0.0.1:9"}),
    (b"GET", b"/admin/slo", None),
    (b"GET", b"/admin/config", None),
    (b"GET", b"/admin/tenants", None),
]


@pytest.mark.parametrize("key", [None, TENANT, "sk-a-guess"])
async def test_every_endpoint_needs_the_admin_key(tmp_path: Path, key: str | None) -> None:
    audit = tmp_path / "audit.jsonl"
    async with sims(1) as (first,), gateway(first, audit) as port:
        for method, path, body in ENDPOINTS:
            status, error = await call(port, method, path, body, key)
            assert (status, error["error"]["code"]) == (401, "invalid_api_key"), path
        _, listing = await call(port, b"GET", b"/admin/backends")
        assert len(listing) == 2 and all(b["flags"] == [] for b in listing)  # nothing changed
        failed = [e for e in audit_lines(audit) if e["event"] == "auth_failed"]
        assert [e["path"] for e in failed] == [p.split(b"?")[0].decode() for _, p, _ in ENDPOINTS]
