"""The routing state the gateway learns from its own decisions, behind protocols keyed by
backend ids (strings, never live objects), so that several gateways can share it:

    PrefixIndex    which backends probably hold which prompt prefixes   (prefix_cache scorer)
    SessionTable   which backend a session was last sent to             (session_affinity)
    ResponsePins   which backend keeps each stored Response, and whose  (the Director)

and what engines that publish KV-cache events report holding (EngineBlocks: kv_events/index.py
keeps it from their events, and the scorer only reads it); and, in fleet/load_board.py
because a pool counts on it, the LoadBoard of in-flight requests
and tokens that the load scorers read. The implementations here are in this process's memory
(routing/prefix_index.py, routing/session_table.py, routing/stored_responses.py), one of each
per pool (the pins: per gateway), built by the composition root (fleetgate/serve.py) and
handed to the plugins through their PluginContext (routing/registry.py). Shared ones (issue
29: Redis) implement the same protocols. Routing is synchronous and does no I/O (DESIGN.md):
every method here returns at once; a shared store answers from a local copy it keeps current.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol


class PrefixIndex(Protocol):
    """Per backend, the chained block hashes of the prompts sent to it (routing/prefix_index.py
    says how they are made), each backend's share bounded by a capacity in blocks."""

    def record(self, backend_id: str, hashes: list[int]) -> None:
        """The backend was sent a prompt with these block hashes: it now caches them."""
        ...

    def matches(self, hashes: list[int], among: Iterable[str] | None = None) -> dict[str, int]:
        """Per backend holding the first block (of `among`, or of all), how many leading
        blocks it holds."""
        ...

    def deepest(self, hashes: list[int], limit: int) -> list[str]:
        """Up to `limit` of the backends holding the longest held prefix."""
        ...

    def set_capacity(self, backend_id: str, blocks: int) -> None:
        """The backend's engine holds about this many blocks (its KV cache): it forgets its
        least recently sent blocks beyond that."""
        ...

    def capacity(self, backend_id: str) -> int:
        """How many blocks the index keeps for the backend."""
        ...

    def forget(self, backend_id: str) -> None:
        """Drop everything recorded for the backend (it left, or its engine restarted)."""
        ...


# How the prefix_cache scorer gets its pool's index: made with the most (hash, backend)
# entries its memory budget allows (`memory_mb`, a parameter of the scorer).
PrefixIndexFactory = Callable[[int], PrefixIndex]


class EngineBlocks(Protocol):
    """What each backend's engine reports holding, by token ids (kv_events/index.py)."""

    def follows(self, backend_id: str) -> bool:
        """Whether the backend's engine has told what it holds."""
        ...

    def matches(self, ids: Sequence[int], among: Sequence[str], now: float) -> dict[str, int]:
        """Per backend of `among` whose engine holds the prompt's first block, how many of
        the prompt's leading tokens (`ids`) it holds."""
        ...

    def deepest(self, ids: Sequence[int], limit: int, now: float) -> list[str]:
        """Up to `limit` of the backends whose engines hold the longest prefix of `ids`."""
        ...

    def expect(self, backend_id: str, ids: Sequence[int], now: float) -> None:
        """A prompt of `ids` was sent to the backend: count it held until its engine says."""
        ...


class SessionTable(Protocol):
    """Session key (the x-session-id header, else the body's `user`) -> the id of the backend
    its last request was sent to, where its conversation's KV cache is."""

    def home(self, session: str) -> str | None:
        """Where the session's last request went (None: not known)."""
        ...

    def record(self, session: str, backend_id: str) -> None:
        """The session's request was sent to that backend."""
        ...


class ResponsePins(Protocol):
    """Stored Response id -> the backend that keeps it, and the tenant whose it is."""

    def record(self, response_id: str, backend_id: str, tenant: str) -> None:
        """The backend made (and keeps) that response for the tenant."""
        ...

    def where(self, response_id: str) -> tuple[str, str] | None:
        """(backend id, tenant) of the response (None: not known)."""
        ...
