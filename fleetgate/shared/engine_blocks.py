"""What the engines hold, as several gateways on one Redis know it: each reads its engines'
KV-cache events itself (kv_events/), so what they report is the same at every gateway; what
differs is what each gateway has *sent* that the engines have not reported yet (a prompt's
blocks count as held for `PENDING_S` after it is sent: kv_events/index.py). Without sharing
that, a prompt's second request that reaches another gateway within a step or a queue of the
first finds nothing, and under cache pressure the engines' word routes worse than the shared
decision index. So each gateway publishes the block keys it expects, with the wall time it
sent them, through a stream (shared/stream.py), and the others hold them until the same
moment: an expectation heard late lapses as early as at its sender, one older than
`PENDING_S` is not held at all. Those sent after this gateway started are counted (`stale`):
many of them say the gateways' clocks disagree by seconds, or their syncs lag; a gateway
starting reads the stream's past, which it does not count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fleetgate.kv_events.index import PENDING_S, EngineBlockIndex
from fleetgate.shared.stream import DecisionStream, Execute

KEEP = 200  # stream entries (one a sync a gateway): several seconds' worth
MAX_QUEUED = 2_000  # expectations queued at most while Redis is away (the newest kept)


class SharedEngineBlocks:
    """An EngineBlocks (routing/stores.py) whose expectations every gateway shares."""

    def __init__(
        self,
        local: EngineBlockIndex,
        execute: Execute,
        key: str,
        gateway_id: str,
        now: Callable[[], float],  # the routing clock (monotonic)
        wall_clock: Callable[[], float],  # what the gateways agree on, within their skew
    ) -> None:
        self._local = local
        self._now = now
        self._wall = wall_clock
        self._started = wall_clock()
        # Only the last PENDING_S of them matter: a short queue while Redis is away, and a
        # short stream for a gateway that starts.
        self.stream = DecisionStream(
            execute, key, gateway_id, tuple[str, list[int], float], self._heard,
            what="expected blocks", keep=KEEP, max_queued=MAX_QUEUED,
        )  # fmt: skip

    def _heard(self, expected: tuple[str, list[int], float]) -> None:
        backend_id, keys, sent = expected
        left = sent + PENDING_S - self._wall()
        if left > 0:
            now = self._now()
            self._local.hold(backend_id, keys, now + min(left, PENDING_S), now)
        elif sent >= self._started:
            self.stream.stale += 1

    def follows(self, backend_id: str) -> bool:
        return self._local.follows(backend_id)

    def matches(self, ids: Sequence[int], among: Sequence[str], now: float) -> dict[str, int]:
        return self._local.matches(ids, among, now)

    def deepest(self, ids: Sequence[int], limit: int, now: float) -> list[str]:
        return self._local.deepest(ids, limit, now)

    def expect(self, backend_id: str, ids: Sequence[int], now: float) -> None:
        keys = self._local.keys_for(backend_id, ids)
        if keys:
            self._local.hold(backend_id, keys, now + PENDING_S, now)
            self.stream.add((backend_id, keys, self._wall()))

    async def sync(self) -> bool:
        return await self.stream.sync()
