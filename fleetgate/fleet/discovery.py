"""Finding out what an OpenAI-compatible server serves: its GET /v1/models."""

from __future__ import annotations

import msgspec

from fleetgate.http.client import HttpClient, Origin
from fleetgate.http.errors import UpstreamError


class DiscoveryError(ValueError):
    """A server could not say which models it serves."""


class _Model(msgspec.Struct):
    id: str


class _ModelList(msgspec.Struct):
    data: list[_Model]


async def list_models(
    client: HttpClient, origin: Origin, headers: list[tuple[bytes, bytes]] | None = None
) -> list[str]:
    """The model ids `origin` lists, in its order."""
    try:
        response = await client.request(origin, b"GET", b"/v1/models", headers or [])
        body = await response.read()
    except UpstreamError as exc:
        raise DiscoveryError(f"{origin}: cannot list its models: {exc}") from None
    if response.status != 200:
        raise DiscoveryError(f"{origin}: GET /v1/models answered {response.status}")
    try:
        return [m.id for m in msgspec.json.decode(body, type=_ModelList).data]
    except msgspec.DecodeError as exc:
        raise DiscoveryError(f"{origin}: GET /v1/models is not a model list: {exc}") from None
