"""The prefix index of several gateways on one Redis: each gateway's routing decisions, seen by
every other within about one sync (shared/stream.py says how, and what happens while Redis is
away).

Each gateway keeps the whole index in its own memory (routing/prefix_index.py), so a lookup
never waits for Redis and never falls back: routing stays synchronous (DESIGN.md). What it
records there it also publishes, as [backend id, [block hashes]] items; the other gateways'
it records as if it had routed them. The stream is one per hash layout (`LAYOUT`): in a
rolling upgrade that changes it, gateways share with those of their own layout only, whose
hashes mean the same blocks.
"""

from __future__ import annotations

from collections.abc import Iterable

from fleetgate.routing.prefix_index import LAYOUT
from fleetgate.routing.stores import PrefixIndex
from fleetgate.shared.stream import DecisionStream, Execute


class SharedPrefixIndex:
    """A PrefixIndex (routing/stores.py) that publishes its decisions and records the other
    gateways'."""

    def __init__(
        self,
        local: PrefixIndex,
        execute: Execute,
        namespace: str,
        gateway_id: str,
        *,
        keep: int = 10_000,
        max_queued: int = 100_000,
    ) -> None:
        self._local = local
        self.stream = DecisionStream(
            execute, f"{namespace}:decisions:v{LAYOUT}", gateway_id, tuple[str, list[int]],
            self._heard, what="prefix index", keep=keep, max_queued=max_queued,
        )  # fmt: skip

    def _heard(self, decision: tuple[str, list[int]]) -> None:
        self._local.record(*decision)

    def record(self, backend_id: str, hashes: list[int]) -> None:
        self._local.record(backend_id, hashes)
        self.stream.add((backend_id, hashes))

    def matches(self, hashes: list[int], among: Iterable[str] | None = None) -> dict[str, int]:
        return self._local.matches(hashes, among)

    def deepest(self, hashes: list[int], limit: int) -> list[str]:
        return self._local.deepest(hashes, limit)

    def set_capacity(self, backend_id: str, blocks: int) -> None:
        self._local.set_capacity(backend_id, blocks)

    def capacity(self, backend_id: str) -> int:
        return self._local.capacity(backend_id)

    def forget(self, backend_id: str) -> None:
        self._local.forget(backend_id)

    async def sync(self) -> bool:
        return await self.stream.sync()
