"""Where each session's last request went, in this process's memory: the `SessionTable`
protocol's in-process implementation (routing/stores.py), read and written by the
`session_affinity` scorer. At most `capacity` sessions are kept, the least recently sent
forgotten first (a forgotten session is placed by its point on the ring again)."""

from __future__ import annotations

from collections import OrderedDict

SESSIONS = 100_000  # sessions kept by default: about 100 bytes each beside their keys


class MemorySessionTable:
    __slots__ = ("_capacity", "_homes")

    def __init__(self, capacity: int = SESSIONS) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._capacity = capacity
        self._homes: OrderedDict[str, str] = OrderedDict()  # session -> backend id

    def home(self, session: str) -> str | None:
        return self._homes.get(session)

    def record(self, session: str, backend_id: str) -> None:
        homes = self._homes
        homes[session] = backend_id
        homes.move_to_end(session)
        if len(homes) > self._capacity:
            homes.popitem(last=False)

    def __len__(self) -> int:
        return len(self._homes)
