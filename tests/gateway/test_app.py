"""The gateway's request ids: a client's own is kept only when it is safe to echo."""

from __future__ import annotations

import pytest

from fleetgate.gateway.app import RequestIds


@pytest.mark.parametrize("client", [b"abc-123", b"trace.id:7_X", b"a" * 128])
def test_a_clean_client_request_id_is_kept(client: bytes) -> None:
    assert RequestIds("p").of(client) == client


@pytest.mark.parametrize(
    "client", [None, b"", b"a" * 129, b"id with space", b"<script>", b"x\x1b[31m", b"\xff"]
)
def test_anything_else_gets_a_fresh_id(client: bytes | None) -> None:
    ids = RequestIds("p")
    assert ids.of(client) == b"p-1"
    assert ids.of(client) == b"p-2"
