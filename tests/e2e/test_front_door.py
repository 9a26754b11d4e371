"""Tenants and keys at a real gateway, through the official openai SDK: who may call, which
models, the limits and the SDK's own retry on a 429, the operator's endpoints."""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.procs import Proc, gateway, get, sim_workers

MODEL, OTHER = "sim-8b", "sim-8b-other"
GOLD, NARROW, LIMITED, ADMIN = (
    "sk-gold-test-key", "sk-narrow-test-key", "sk-limited-test-key", "sk-admin-test-key"
)  # fmt: skip


def audit_path(factory: pytest.TempPathFactory) -> Path:
    return factory.getbasetemp() / "audit" / "audit.jsonl"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Proc]]:
    with sim_workers(MODEL, 2) as workers:
        config = {
            "server": {"admin": True, "audit_log": str(audit_path(tmp_path_factory))},
            "auth": {"admin_keys": [ADMIN]},
            "tenants": [
                {"name": "gold", "keys": [GOLD], "priority": "critical"},
                {"name": "narrow", "keys": [NARROW], "models": [MODEL]},
                {
                    "name": "limited",
                    "keys": [LIMITED],
                    "limits": {"requests_per_minute": 20, "requests_burst": 2},
                },
            ],
            "pools": [
                {"model": m, "policy": "round_robin", "backends": [{"url": u}]}
                for m, u in ((MODEL, workers[0]), (OTHER, workers[1]))
            ],
        }
        path = tmp_path_factory.mktemp("gw") / "gw.yaml"
        path.write_text(json.dumps(config))
        with gateway(["--config", str(path)]) as (url, proc):
            yield url, proc


def client(url: str, key: str, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=retries)


def chat(c: openai.OpenAI, model: str = MODEL) -> str:
    reply = c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    return reply.choices[0].message.content or ""


def test_the_banner_says_auth_is_on_and_where_the_dashboard_is(fleet: tuple[str, Proc]) -> None:
    assert fleet[1].wait_for(r"(auth: on)")
    assert fleet[1].wait_for(r"dashboard: (http://127\.0\.0\.1:\d+/dashboard)")


def test_a_missing_or_wrong_key_is_an_authentication_error(fleet: tuple[str, Proc]) -> None:
    url = fleet[0]
    with pytest.raises(openai.AuthenticationError, match="not valid") as info:
        chat(client(url, "sk-nobody-has-this-key"))
    assert info.value.status_code == 401
    assert info.value.code == "invalid_api_key"
    status, _, body = get(url + "/v1/models")  # no Authorization header at all
    assert status == 401 and b"Authorization: Bearer" in body
    assert chat(client(url, GOLD))


def test_a_key_may_use_only_its_tenants_models(fleet: tuple[str, Proc]) -> None:
    narrow = client(fleet[0], NARROW)
    assert chat(narrow)
    with pytest.raises(openai.PermissionDeniedError, match=OTHER):
        chat(narrow, OTHER)
    assert [m.id for m in narrow.models.list()] == [MODEL]
    assert sorted(m.id for m in client(fleet[0], GOLD).models.list()) == [MODEL, OTHER]


def test_a_limited_key_gets_429_with_retry_after_and_the_sdk_retry_succeeds(
    fleet: tuple[str, Proc],
) -> None:
    url = fleet[0]
    limited = client(url, LIMITED)
    raw = limited.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert raw.headers["x-ratelimit-limit-requests"] == "20"
    assert raw.headers["x-ratelimit-remaining-requests"] == "1"
    chat(limited)
    with pytest.raises(openai.RateLimitError, match="20 requests per minute") as info:
        chat(limited)
    assert info.value.response.headers["retry-after"] in ("2", "3")  # one refill: 3 s
    assert info.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    started = time.monotonic()
    assert chat(client(url, LIMITED, retries=3))  # the SDK waits as Retry-After says
    assert time.monotonic() - started > 1.0


ADMIN_READS = ("/admin/backends", "/admin/slo", "/admin/config", "/admin/tenants")
ADMIN_CHANGES = (
    ("POST", "/admin/backends", {"model": MODEL, "url": "http://127.0.0.1:9"}),
    ("DELETE", "/admin/backends?backend=127.0.0.1:9", None),
    ("POST", "/admin/weight", {"backend": "127.0.0.1:9", "weight": 2}),
    ("POST", "/admin/drain", {"backend": "127.0.0.1:9"}),
)


def test_the_admin_endpoints_need_the_admin_key(fleet: tuple[str, Proc]) -> None:
    url = fleet[0]

    def status(method: str, path: str, body: object, key: str | None) -> int:
        request = urllib.request.Request(
            url + path, data=None if body is None else json.dumps(body).encode(), method=method,
            headers={} if key is None else {"Authorization": f"Bearer {key}"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    assert get(url + "/admin/backends")[0] == 401
    # One wrong key each (no key, a tenant's, a guess), to stay under the audit log's rate of
    # failures that the next test counts on.
    endpoints = [*(("GET", p, None) for p in ADMIN_READS), *ADMIN_CHANGES]
    for i, (method, path, body) in enumerate(endpoints):
        key = (None, GOLD, "sk-an-operators-guess")[i % 3]
        assert status(method, path, body, key) == 401, (method, path, key)
    for path in ADMIN_READS:
        assert status("GET", path, None, ADMIN) == 200, path


def test_admin_actions_and_failed_keys_are_in_the_audit_log(
    fleet: tuple[str, Proc], tmp_path_factory: pytest.TempPathFactory
) -> None:
    url = fleet[0]
    with pytest.raises(openai.AuthenticationError):
        chat(client(url, "sk-an-attackers-guess"))
    with pytest.raises(openai.PermissionDeniedError):
        chat(client(url, NARROW), OTHER)
    listing = urllib.request.Request(
        url + "/admin/backends", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    with urllib.request.urlopen(listing, timeout=10) as response:
        backend = json.loads(response.read())[0]["backend"]

    def drain(key: str, draining: bool) -> int:
        body = json.dumps({"backend": backend, "draining": draining}).encode()
        request = urllib.request.Request(
            url + "/admin/drain", data=body, method="POST",
            headers={"Authorization": f"Bearer {key}", "content-type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    assert drain("sk-a-wrong-admin-key", True) == 401
    assert drain(ADMIN, True) == 200
    assert drain(ADMIN, False) == 200
    path = audit_path(tmp_path_factory)
    text = path.read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    events = [(e["event"], e.get("reason"), e.get("role")) for e in lines]
    assert ("auth_failed", "invalid_api_key", None) in events
    assert ("auth_failed", "model_not_allowed", None) in events
    assert ("auth_failed", "invalid_api_key", "admin") in events
    drains = [(e["backend"], e["draining"], e["key"]) for e in lines if e["event"] == "admin_drain"]
    admin_id = hashlib.sha256(ADMIN.encode()).hexdigest()[:16]
    assert drains == [(backend, True, admin_id), (backend, False, admin_id)]
    for secret in ("sk-an-attackers-guess", "sk-a-wrong-admin-key", ADMIN, NARROW):
        assert secret not in text
    assert all(line["time"].endswith("Z") for line in lines)
