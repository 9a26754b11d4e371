"""The gateway's config as an operator may read it (GET /admin/config): every secret replaced.

Secrets are found by their field's name, at any depth: tenants' `keys`, `auth.admin_keys` and
`heartbeat_keys`, a backend's `api_key` (a plugin's parameter of that name too); and in any
URL, a user name and password (`limits.redis_url`'s, a backend's). A list of keys keeps its
length, so an operator can still count them. Paths (`auth.key_file`, `tls_key_file`) are not
secrets: the files' contents never appear.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec

REDACTED = "<redacted>"
SECRET_FIELDS = frozenset({"keys", "admin_keys", "heartbeat_keys", "api_key"})


def redacted(settings: msgspec.Struct) -> Any:
    """`settings` (the Config, or any section) as JSON-ready builtins, secrets replaced."""
    return _redact(msgspec.to_builtins(settings))


def without_credentials(url: str) -> str:
    """`url` with any user name and password replaced (it is returned as it is without)."""
    if "@" not in url:
        return url
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{REDACTED}@{host}"))


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _secret(v) if k in SECRET_FIELDS else _redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    if isinstance(value, str) and "://" in value:
        return without_credentials(value)
    return value


def _secret(value: Any) -> Any:
    if isinstance(value, list):
        return [REDACTED for _ in value]
    return None if value is None else REDACTED
