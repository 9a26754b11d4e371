"""The agent's rounds: what it prints, what it pushes (to a real HTTP server on a free port),
and what it says when the gateway refuses."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest

from fleetgate.fleet.gpu import GpuReading
from fleetgate.http.client import HttpClient
from fleetgate.http.server import HttpServer, Request, start_server
from fleetgate.http.writer import ResponseWriter
from fleetgate.openai_api import error_body, send_error
from fleetgate.workers.gpu.agent import AgentSettings, GpuAgent


class Readings:
    """A GpuReader that gives what the test sets."""

    def __init__(self, *readings: GpuReading) -> None:
        self.readings = list(readings)

    def read(self) -> list[GpuReading]:
        return self.readings

    def close(self) -> None:
        pass


class Gateway:
    """Answers heartbeats with `status`, keeping what it was sent."""

    def __init__(self) -> None:
        self.status = 200
        self.received: list[tuple[dict[bytes, bytes], bytes]] = []

    async def handle(self, request: Request, writer: ResponseWriter) -> None:
        self.received.append((dict(request.headers), request.body))
        body = b'{"ok":true}' if self.status == 200 else error_body(self.status, "no key")
        writer.send(self.status, [(b"content-type", b"application/json")], body)


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[Gateway, HttpServer]]:
    fake = Gateway()
    server = await start_server(fake.handle, send_error, "127.0.0.1", 0)
    yield fake, server
    await server.close()


def test_settings_need_somewhere_to_send_or_print() -> None:
    with pytest.raises(ValueError, match="--gateway URL"):
        AgentSettings()
    with pytest.raises(ValueError, match="--backend"):
        AgentSettings(gateway="http://127.0.0.1:8080")


async def test_print_only_shows_each_round_as_a_json_line() -> None:
    shown: list[str] = []
    reader = Readings(GpuReading(index=0, temperature_c=50, throttle_reasons=[]))
    client = HttpClient()
    agent = GpuAgent(reader, AgentSettings(show=True, once=True), client, show=shown.append)
    await agent.run()
    await client.close()
    assert msgspec.json.decode(shown[0]) == {
        "backend": None, "gpu": [{"index": 0, "temperature_c": 50, "throttle_reasons": []}]
    }  # fmt: skip


async def test_pushes_carry_the_key_and_a_refusal_is_said_once(
    gateway: tuple[Gateway, HttpServer],
) -> None:
    fake, server = gateway
    said: list[str] = []
    settings = AgentSettings(gateway=f"http://127.0.0.1:{server.port}", backend="10.0.0.5:8000",
                             key="hb-key")  # fmt: skip
    client = HttpClient()
    agent = GpuAgent(Readings(GpuReading(index=0)), settings, client, say=said.append)
    fake.status = 401
    await agent.round()
    await agent.round()
    fake.status = 200
    await agent.round()
    await client.close()
    assert said == ["the gateway answered 401: no key", "pushing readings again"]
    headers, body = fake.received[-1]
    assert headers[b"authorization"] == b"Bearer hb-key"
    assert msgspec.json.decode(body) == {"backend": "10.0.0.5:8000", "gpu": [{"index": 0}]}


async def test_a_gateway_away_is_said_and_the_agent_goes_on() -> None:
    said: list[str] = []
    settings = AgentSettings(gateway="http://127.0.0.1:9", backend="b", interval_s=0.5)
    client = HttpClient(connect_timeout_s=0.5)
    agent = GpuAgent(Readings(GpuReading(index=0)), settings, client, say=said.append)
    await agent.round()
    await client.close()
    assert said[0].startswith("cannot reach the gateway at http://127.0.0.1:9")
