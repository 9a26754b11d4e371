"""The config as GET /admin/config shows it: known secrets in every place a config can hold
one, and none of them in the answer."""

from __future__ import annotations

import hashlib
import json

from fleetgate.config import parse_config
from fleetgate.gateway.redact import REDACTED, redacted, without_credentials

SECRETS = {
    "tenant": "sk-tenant-secret-1",
    "admin": "sk-admin-secret-2",
    "heartbeat": "sk-heartbeat-secret-3",
    "backend": "sk-backend-secret-4",
    "prefill": "sk-prefill-secret-5",
    "redis": "redis-password-6",
    "url": "url-password-7",
    "plugin": "sk-plugin-secret-8",
    "collector": "Bearer collector-secret-9",
    "query": "query-secret-10",
    "token": "plugin-token-secret-11",
}
HASHED = "sha256:" + hashlib.sha256(b"sk-hashed-tenant-key").hexdigest()


def config_with_secrets() -> dict[str, object]:
    s = SECRETS
    return {
        "auth": {"admin_keys": [s["admin"]], "heartbeat_keys": [s["heartbeat"]]},
        "tenants": [{"name": "t", "keys": [s["tenant"], HASHED]}],
        "limits": {"redis_url": f"redis://user:{s['redis']}@127.0.0.1:6379/0"},
        "tracing": {
            "headers": {"authorization": s["collector"]},
            "endpoint": f"https://collector.example:4318/v1/traces?key={s['query']}",
        },
        "pools": [
            {
                "model": "m",
                "backends": [
                    {"url": "http://127.0.0.1:8000", "api_key": s["backend"]},
                    {"url": f"http://user:{s['url']}@127.0.0.1:8001"},
                ],
                "prefill": {"backends": [{"sim": "h100-llama3-8b", "api_key": s["prefill"]}]},
                "policy": "balanced",
                "policy_params": {"api_key": s["plugin"], "auth_token": s["token"]},
            }
        ],
    }


def test_no_secret_of_the_config_is_shown_and_everything_else_is() -> None:
    shown = redacted(parse_config(config_with_secrets()))
    text = json.dumps(shown)
    for secret in [*SECRETS.values(), HASHED]:
        assert secret not in text
    assert shown["tenants"][0]["keys"] == [REDACTED, REDACTED]  # counted, not shown
    assert shown["auth"]["admin_keys"] == [REDACTED]
    assert shown["limits"]["redis_url"] == f"redis://{REDACTED}@127.0.0.1:6379/0"
    backends = shown["pools"][0]["backends"]
    assert [b["api_key"] for b in backends] == [REDACTED, None]
    assert backends[1]["url"] == f"http://{REDACTED}@127.0.0.1:8001"
    assert backends[0]["url"] == "http://127.0.0.1:8000"
    assert shown["pools"][0]["health_check"]["interval_s"] == 5.0  # defaults filled in
    assert shown["server"]["port"] == 8080
    assert shown["tracing"]["headers"] == {"authorization": REDACTED}
    assert shown["tracing"]["endpoint"] == f"https://collector.example:4318/v1/traces?{REDACTED}"
    # Limits named after tokens are not secrets, nor a file's path or the Redis keys' prefix.
    assert shown["limits"]["assumed_output_tokens"] == 256
    assert shown["limits"]["key_prefix"] == "fleetgate"


def test_a_url_without_credentials_is_left_as_it_is() -> None:
    for url in ("http://10.0.0.5:8000/v1", "https://host/a@b", "redis://127.0.0.1:6379/0"):
        assert without_credentials(url) == url
    assert without_credentials("http://:pw@h:1") == f"http://{REDACTED}@h:1"
