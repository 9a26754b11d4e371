"""The session table and the Responses pins shared through Redis (shared/tables.py), against a
real redis-server: what one gateway learns, the others know after a sync."""

from __future__ import annotations

from typing import Any

from fleetgate.routing.session_table import MemorySessionTable
from fleetgate.routing.stored_responses import StoredResponses
from fleetgate.shared.tables import SharedPins, SharedSessionTable


def tables(client: Any, *ids: str) -> list[SharedSessionTable]:
    return [
        SharedSessionTable(MemorySessionTable(), client.execute_command, "test:s", gateway_id)
        for gateway_id in ids
    ]


async def test_a_sessions_home_is_known_to_every_gateway_after_a_sync(client: Any) -> None:
    a, b = tables(client, "gw-a", "gw-b")
    a.record("alice", "b1")
    assert a.home("alice") == "b1" and b.home("alice") is None
    await a.sync()
    await b.sync()
    assert b.home("alice") == "b1"
    b.record("alice", "b2")  # moved (its home was full): the move is told too
    await b.sync()
    await a.sync()
    assert a.home("alice") == "b2"


async def test_a_session_that_stays_home_publishes_nothing_more(client: Any) -> None:
    a, b = tables(client, "gw-a", "gw-b")
    for _ in range(50):
        a.record("bob", "b1")
    await a.sync()
    await b.sync()
    assert b.home("bob") == "b1" and b.stream.heard == 1


async def test_a_responses_pin_and_its_tenant_are_known_to_every_gateway(client: Any) -> None:
    a, b = (
        SharedPins(StoredResponses(), client.execute_command, "test:r", gateway_id)
        for gateway_id in ("gw-a", "gw-b")
    )
    a.record("resp_1", "b3", "gold")
    assert b.where("resp_1") is None
    await a.sync()
    await b.sync()
    assert b.where("resp_1") == ("b3", "gold")  # the Director checks the tenant against it
