"""API keys: stored as SHA-256 digests and looked up by the digest of the key presented.

Comparing digests, not keys, is what makes the check safe against timing: how long a
comparison takes depends on where two digests first differ, and a client cannot choose the
digest of what it sends, so the time says nothing about any stored key.

A key reaches the gateway as `Authorization: Bearer KEY` (or `api-key: KEY`, as Azure OpenAI
clients send it). Only digests are kept: the config may give a key as `sha256:<hex>`, and a
key given in clear is hashed as it is loaded. A key file holds one `OWNER KEY` pair per line
(`#` starts a comment): OWNER is a tenant's name, or `:admin` / `:heartbeat` for the
operator's credentials.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

MIN_KEY_CHARS = 12  # shorter keys are guessable; refused at load
_PREFIX = "sha256:"
ADMIN, HEARTBEAT = ":admin", ":heartbeat"  # key-file owners of the operator's credentials

T = TypeVar("T")


def digest_of(key: str) -> bytes:
    """The stored form of a key given in config: `sha256:<hex>` decoded, or a clear key
    hashed. ValueError for a short key or a malformed digest (the message never holds the
    key itself)."""
    if key.startswith(_PREFIX):
        hexdigest = key[len(_PREFIX) :]
        try:
            raw = bytes.fromhex(hexdigest)
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise ValueError("a `sha256:` key must be followed by 64 hex digits")
        return raw
    if len(key) < MIN_KEY_CHARS or not key.isprintable() or " " in key:
        raise ValueError(
            f"an API key must be at least {MIN_KEY_CHARS} printable characters without spaces"
        )
    return hashlib.sha256(key.encode()).digest()


def bearer(headers: dict[bytes, bytes]) -> bytes | None:
    """The key a request presents, or None."""
    value = headers.get(b"authorization")
    if value is not None:
        scheme, _, key = value.partition(b" ")
        if scheme.lower() == b"bearer" and key:
            return key.strip()
        return None
    return headers.get(b"api-key")


def basic_password(headers: dict[bytes, bytes]) -> bytes | None:
    """The password of an `Authorization: Basic` header (base64 of `user:password`), or None:
    how a browser sends a key it was asked for (the dashboard)."""
    value = headers.get(b"authorization")
    if value is None:
        return None
    scheme, _, encoded = value.partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except ValueError:  # binascii.Error is one
        return None
    _, colon, password = decoded.partition(b":")
    return password if colon and password else None


@dataclass(slots=True)
class KeyRing(Generic[T]):
    """Digests of keys and what each belongs to."""

    _owners: dict[bytes, T] = field(default_factory=dict)

    def add(self, key: str, owner: T) -> None:
        """Add a key (clear or `sha256:`); ValueError if it is malformed or already taken."""
        digest = digest_of(key)
        if digest in self._owners:
            raise ValueError("the same API key is given twice")
        self._owners[digest] = owner

    def owner(self, key: bytes | None) -> T | None:
        """Who `key` belongs to, or None."""
        if key is None:
            return None
        return self._owners.get(hashlib.sha256(key).digest())

    def owners(self) -> list[T]:
        """What every key belongs to."""
        return list(self._owners.values())

    def __len__(self) -> int:
        return len(self._owners)


def read_key_file(path: str | Path) -> list[tuple[str, str]]:
    """(owner, key) pairs from a key file; ValueError naming the line of a malformed one."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read key file {path}: {exc.strerror}") from None
    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{number}: write `OWNER KEY` (two words)")
        pairs.append((parts[0], parts[1]))
    return pairs
