"""The gateway's config as an operator may read it (GET /admin/config): every secret replaced.

Secrets are found by their field's name, at any depth: tenants' `keys`, `auth.admin_keys` and
`heartbeat_keys`, a backend's `api_key` (a plugin's parameter of that name too), the values of
`tracing.headers` (a collector's credentials), and any field one of whose words is key, token,
secret or password (not a `*_file` path); and in any URL, a user name and password and the
whole query string (`limits.redis_url`'s, a backend's, the collector's). A list of keys keeps
its length, so an operator can still count them. Paths (`auth.key_file`, `tls_key_file`) are
not secrets: the files' contents never appear.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec

REDACTED = "<redacted>"
SECRET_FIELDS = frozenset({"keys", "admin_keys", "heartbeat_keys", "api_key", "headers"})
# A word of any other field's name that marks it secret (`client_secret`, `auth_token`), except
# a file's path and the Redis keys' prefix.
_SECRET_WORDS = frozenset({"key", "token", "secret", "password", "passwd", "apikey"})
_NOT_SECRET = frozenset({"key_prefix"})


def redacted(settings: msgspec.Struct) -> Any:
    """`settings` (the Config, or any section) as JSON-ready builtins, secrets replaced."""
    return _redact(msgspec.to_builtins(settings))


def without_credentials(url: str) -> str:
    """`url` with any user name and password, and its query string, replaced (it is returned
    as it is without them)."""
    parts = urlsplit(url)
    if parts.query:
        parts = parts._replace(query=REDACTED)
    if parts.username is not None or parts.password is not None:
        host = parts.netloc.rpartition("@")[2]
        parts = parts._replace(netloc=f"{REDACTED}@{host}")
    return urlunsplit(parts)


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _secret(v) if _is_secret(k) else _redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    if isinstance(value, str) and "://" in value:
        return without_credentials(value)
    return value


def _is_secret(name: str) -> bool:
    if name in SECRET_FIELDS:
        return True
    if name in _NOT_SECRET or name.endswith("_file"):
        return False
    return not _SECRET_WORDS.isdisjoint(name.lower().replace("-", "_").split("_"))


def _secret(value: Any) -> Any:
    if isinstance(value, dict):
        return dict.fromkeys(value, REDACTED)
    if isinstance(value, list):
        return [REDACTED for _ in value]
    return None if value is None else REDACTED
