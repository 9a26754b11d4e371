"""The session table and the Responses pins of several gateways on one Redis: a session's
home, and where a stored Response is kept (and whose it is), told to every gateway within
about one sync (shared/stream.py says how, and what happens while Redis is away).

Each gateway reads its own copy in memory (routing/session_table.py,
routing/stored_responses.py). A follow-up that reaches another gateway sooner than one sync
after its first was answered is routed as if its first were unknown there (for a Response:
by ordinary routing, and the engine's own 404 if it went elsewhere).
"""

from __future__ import annotations

from fleetgate.routing.session_table import MemorySessionTable
from fleetgate.routing.stored_responses import StoredResponses
from fleetgate.shared.stream import DecisionStream, Execute


class SharedSessionTable:
    """A SessionTable (routing/stores.py) whose homes every gateway learns."""

    def __init__(self, local: MemorySessionTable, execute: Execute, namespace: str,
                 gateway_id: str) -> None:  # fmt: skip
        self._local = local
        self.stream = DecisionStream(
            execute, f"{namespace}:homes", gateway_id, tuple[str, str], self._heard,
            what="session table",
        )  # fmt: skip

    def _heard(self, home: tuple[str, str]) -> None:
        self._local.record(*home)

    def home(self, session: str) -> str | None:
        return self._local.home(session)

    def record(self, session: str, backend_id: str) -> None:
        if self._local.home(session) != backend_id:  # a session staying home says nothing new
            self.stream.add((session, backend_id))
        self._local.record(session, backend_id)

    async def sync(self) -> bool:
        return await self.stream.sync()


class SharedPins:
    """ResponsePins (routing/stores.py) that every gateway learns: a follow-up sent to any of
    them reaches the backend keeping its first, and only for the tenant whose it is."""

    def __init__(self, local: StoredResponses, execute: Execute, namespace: str,
                 gateway_id: str) -> None:  # fmt: skip
        self._local = local
        self.stream = DecisionStream(
            execute, f"{namespace}:pins", gateway_id, tuple[str, str, str], self._heard,
            what="Responses pin registry",
        )  # fmt: skip

    def _heard(self, pin: tuple[str, str, str]) -> None:
        self._local.record(*pin)

    def record(self, response_id: str, backend_id: str, tenant: str) -> None:
        self._local.record(response_id, backend_id, tenant)
        self.stream.add((response_id, backend_id, tenant))

    def where(self, response_id: str) -> tuple[str, str] | None:
        return self._local.where(response_id)

    async def sync(self) -> bool:
        return await self.stream.sync()
