"""What each gateway decides, told to the others through one Redis stream: the prefix index's
routing decisions, the session table's homes. Every gateway keeps the whole state in its own
memory and reads it there; what it decides it also queues, and every sync one round trip

    XADD  {key} MAXLEN ~ keep  * g <its id> r <its queued items>
    XREAD {key} from the last entry it read

publishes its queue as one entry (msgpack: a list of items) and applies the other gateways'
entries since its last read, as if it had decided them. A gateway that starts reads from the
oldest entry kept: it begins warm, with the last `keep` syncs' decisions of the fleet.

Redis away: nothing waits for it. The queue waits for the next sync, the oldest items beyond
`max_queued` dropped (`dropped`); each failed sync is counted (`failures`), one warning an
outage; when Redis answers again the gateway goes on from the entry it read last. Entries that
do not decode are skipped (`undecodable`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import msgspec
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

Execute = Callable[..., Awaitable[Any]]  # a Redis client's execute_command
T = TypeVar("T")
READ_COUNT = 200  # stream entries read per round trip
_encode = msgspec.msgpack.Encoder().encode


class DecisionStream(Generic[T]):
    """One kind of decision (items of `kind`), published and heard through stream `key`;
    `apply` records another gateway's item here."""

    def __init__(
        self,
        execute: Execute,
        key: str,
        gateway_id: str,
        kind: type[T],
        apply: Callable[[T], None],
        *,
        what: str,
        keep: int = 10_000,
        max_queued: int = 100_000,
    ) -> None:
        self._execute = execute
        self._key = key
        self.gateway_id = gateway_id
        self._mine = gateway_id.encode()
        self._decode = msgspec.msgpack.Decoder(list[kind]).decode  # type: ignore[valid-type]
        self._apply = apply
        self._what = what  # what the warnings call it
        self._keep = keep  # stream entries Redis keeps (about: MAXLEN ~)
        self._max_queued = max_queued
        self._queued: deque[T] = deque(maxlen=max_queued)  # the oldest go first
        self._last = b"0"  # the last stream entry read
        self.failures = 0  # syncs Redis did not answer
        self.dropped = 0  # items never published (Redis away too long)
        self.undecodable = 0  # entries skipped
        self.heard = 0  # other gateways' items applied
        self.stale = 0  # ... heard too late to apply (counted by the part that applies them)
        self._down = False
        self._answered = False  # some sync reached Redis

    @property
    def shared(self) -> bool:
        """The last sync reached Redis."""
        return self._answered and not self._down

    def add(self, item: T) -> None:
        """Queue an item decided here, for the next sync."""
        if len(self._queued) == self._max_queued:
            self.dropped += 1
        self._queued.append(item)

    async def sync(self) -> bool:
        """Publish the queue, then apply the other gateways' entries since the last read;
        False when Redis did not answer (the queue waits for the next sync)."""
        queued = list(self._queued)
        self._queued.clear()
        try:
            if queued:
                entry = ("g", self.gateway_id, "r", _encode(queued))
                await self._execute("XADD", self._key, "MAXLEN", "~", self._keep, "*", *entry)
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
                    "Redis did not answer (%s): the %s learns from this gateway alone until "
                    "it does", str(exc) or type(exc).__name__, self._what,
                )  # fmt: skip
            return False
        if self._down:
            self._down = False
            log.warning("Redis answers again: the %s is shared again", self._what)
        self._answered = True
        return True

    async def _read(self) -> bool:
        """Apply one batch of the stream's newer entries; True if there may be more."""
        reply = await self._execute("XREAD", "COUNT", READ_COUNT, "STREAMS", self._key, self._last)
        if not reply:
            return False
        entries = reply[0][1]
        for entry_id, values in entries:  # the client makes each entry's fields a dict
            self._last = entry_id
            if values.get(b"g") == self._mine:
                continue
            try:
                items = self._decode(values[b"r"])
            except (KeyError, msgspec.DecodeError, msgspec.ValidationError):
                self.undecodable += 1
                continue
            for item in items:
                self._apply(item)
            self.heard += len(items)
        return len(entries) == READ_COUNT
