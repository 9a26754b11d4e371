"""API keys: kept as digests, found by the key presented, malformed ones refused at load."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fleetgate.traffic.keys import KeyRing, bearer, digest_of, read_key_file


def test_keys_are_stored_as_digests_and_found_by_the_key() -> None:
    ring: KeyRing[str] = KeyRing()
    ring.add("sk-gold-example-1", "gold")
    ring.add("sha256:" + hashlib.sha256(b"sk-silver-example").hexdigest(), "silver")
    assert ring.owner(b"sk-gold-example-1") == "gold"
    assert ring.owner(b"sk-silver-example") == "silver"
    assert ring.owner(b"sk-gold-example-2") is None
    assert ring.owner(None) is None
    assert b"sk-gold-example-1" not in repr(ring._owners).encode()


@pytest.mark.parametrize(
    ("key", "error"),
    [
        ("short", "at least 12"),
        ("has a space in it", "without spaces"),
        ("sha256:abc", "64 hex digits"),
        ("sha256:" + "zz" * 32, "64 hex digits"),
    ],
)
def test_a_malformed_key_is_refused_without_echoing_it(key: str, error: str) -> None:
    with pytest.raises(ValueError, match=error) as info:
        digest_of(key)
    assert key not in str(info.value)


def test_the_same_key_twice_is_refused() -> None:
    ring: KeyRing[str] = KeyRing()
    ring.add("sk-same-key-twice", "a")
    with pytest.raises(ValueError, match="twice"):
        ring.add("sha256:" + hashlib.sha256(b"sk-same-key-twice").hexdigest(), "b")


def test_bearer_reads_authorization_or_azure_api_key() -> None:
    assert bearer({b"authorization": b"Bearer sk-1"}) == b"sk-1"
    assert bearer({b"authorization": b"bearer  sk-1 "}) == b"sk-1"
    assert bearer({b"authorization": b"Basic dXNlcjpwYXNz"}) is None
    assert bearer({b"authorization": b"Bearer"}) is None
    assert bearer({b"api-key": b"sk-2"}) == b"sk-2"
    assert bearer({}) is None


def test_a_key_file_has_one_owner_and_key_per_line(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(
        "# tenants\ngold sk-gold-from-file  # the gold key\n\n:admin sk-admin-from-file\n"
    )
    assert read_key_file(path) == [("gold", "sk-gold-from-file"), (":admin", "sk-admin-from-file")]
    path.write_text("gold\n")
    with pytest.raises(ValueError, match=r"keys:1: write `OWNER KEY`"):
        read_key_file(path)
    with pytest.raises(ValueError, match="cannot read key file"):
        read_key_file(tmp_path / "missing")
