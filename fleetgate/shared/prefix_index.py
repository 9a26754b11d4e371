"""The prefix index of several gateways on one Redis: each gateway's routing decisions, seen by
every other within about one sync.

Each gateway keeps the whole index in its own memory (routing/prefix_index.py), so a lookup
never waits for Redis and never falls back: routing stays synchronous (DESIGN.md). What it
records there it also queues, and every `sync_s` one round trip to Redis

    XADD  {namespace}:decisions MAXLEN ~ keep  * g <its id> r <its queued decisions>
    XREAD {namespace}:decisions from the last entry it read

publishes its decisions of the last interval as one stream entry (msgpack: a list of
[backend id, [block hashes]]) and reads the others', which it records as if it had made them.
A gateway that starts reads the stream from its oldest kept entry: it begins warm, with the
last `keep` intervals' decisions of the fleet.

Redis away: decisions still go to the local index; the oldest queued beyond `max_queued` are
dropped (counted in `dropped`), failures counted in `failures`, one warning an outage; when
Redis answers again the gateway goes on from the entry it read last. Entries that do not
decode are skipped (counted in `undecodable`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import msgspec
from redis.exceptions import RedisError

from fleetgate.routing.stores import PrefixIndex

log = logging.getLogger(__name__)

Execute = Callable[..., Awaitable[Any]]
_Decision = tuple[str, list[int]]
_decisions = msgspec.msgpack.Decoder(list[tuple[str, list[int]]])
_encode = msgspec.msgpack.Encoder().encode
READ_COUNT = 200  # stream entries read per round trip


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
        self._execute = execute
        self._stream = f"{namespace}:decisions"
        self.gateway_id = gateway_id
        self._keep = keep  # stream entries Redis keeps (about: MAXLEN ~)
        self._max_queued = max_queued  # decisions held while Redis is away
        self._queued: deque[_Decision] = deque(maxlen=max_queued)  # the oldest go first
        self._last = b"0"  # the last stream entry read
        self.failures = 0
        self.dropped = 0  # decisions never published (Redis away too long)
        self.undecodable = 0
        self.heard = 0  # other gateways' decisions recorded
        self._down = False

    # -- the PrefixIndex protocol: the local index, decisions queued --------------------------

    def record(self, backend_id: str, hashes: list[int]) -> None:
        self._local.record(backend_id, hashes)
        if len(self._queued) == self._max_queued:
            self.dropped += 1
        self._queued.append((backend_id, hashes))

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

    # -- sharing ------------------------------------------------------------------------------

    async def sync(self) -> bool:
        """Publish the decisions queued, then record the other gateways' that came since the
        last read; False when Redis did not answer (the queue waits for the next sync)."""
        queued = list(self._queued)
        self._queued.clear()
        try:
            if queued:
                await self._execute(
                    "XADD", self._stream, "MAXLEN", "~", self._keep, "*",
                    "g", self.gateway_id, "r", _encode(queued),
                )  # fmt: skip
                queued = []
            while await self._read():
                pass
        except (RedisError, OSError) as exc:
            if queued:  # to go with the next sync, the oldest dropped beyond the bound
                waiting = [*queued, *self._queued]
                self.dropped += max(0, len(waiting) - self._max_queued)
                self._queued = deque(waiting, maxlen=self._max_queued)
            self.failures += 1
            if not self._down:
                self._down = True
                log.warning(
                    "Redis did not answer (%s): the prefix index learns from this gateway's "
                    "own decisions alone until it does", str(exc) or type(exc).__name__,
                )  # fmt: skip
            return False
        if self._down:
            self._down = False
            log.warning("Redis answers again: the prefix index is shared again")
        return True

    async def _read(self) -> bool:
        """Record one batch of the stream's newer entries; True if there may be more."""
        reply = await self._execute(
            "XREAD", "COUNT", READ_COUNT, "STREAMS", self._stream, self._last
        )
        if not reply:
            return False
        entries = reply[0][1]
        mine = self.gateway_id.encode()
        for entry_id, values in entries:  # the client makes each entry's fields a dict
            self._last = entry_id
            if values.get(b"g") == mine:
                continue
            try:
                decisions = _decisions.decode(values[b"r"])
            except (KeyError, msgspec.DecodeError, msgspec.ValidationError):
                self.undecodable += 1
                continue
            for backend_id, hashes in decisions:
                self._local.record(backend_id, hashes)
            self.heard += len(decisions)
        return len(entries) == READ_COUNT
