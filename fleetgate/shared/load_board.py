"""The load board of several gateways on one Redis: each gateway's own counts as a lease with
a TTL, and every gateway's view the sum of all the leases.

A gateway counts its own sends in memory, as a gateway alone does (fleet/load_board.py: a
change is a lookup and a few additions, never I/O), and every `sync_s` runs one script:

    its counts -> its lease, a hash {backend id: "in_flight tokens prefill"} that lapses
                  after ttl_s
    its id     -> the pool's set of gateways, scored by when its lease lapses (Redis's
                  clock, so skewed gateway clocks agree); the lapsed are pruned
    reply      <- every other gateway's lease, and how many gateways count on the board

Each record it shows is then its own counts plus the others' as last read, kept current in
place (a reader may hold it). So another gateway's sends are seen within about one `sync_s`;
a gateway that stops leaves at once, one that dies after ttl_s.

Redis away: no request waits for it or fails for it. The sync fails, is logged once per
outage and counted (`failures`); the others' counts are kept for ttl_s (a lease's life) and
then dropped, so the board reads this gateway's own counts until Redis answers again, and
the first sync after that brings the others back. A standalone Redis (the script reads
lease keys it builds from the set: Redis Cluster refuses that).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from redis.exceptions import RedisError

from fleetgate.fleet.load_board import BackendLoad

log = logging.getLogger(__name__)

Execute = Callable[..., Awaitable[Any]]  # a Redis client's execute_command

_HSET_ARGS = 1000  # field-value arguments per HSET (Lua's unpack has a stack limit)
SYNC_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, ttl = ARGV[1], tonumber(ARGV[2])
local mine = KEYS[2] .. me
redis.call('DEL', mine)
for i = 3, #ARGV, %d do
  redis.call('HSET', mine, unpack(ARGV, i, math.min(i + %d - 1, #ARGV)))
end
redis.call('PEXPIRE', mine, ttl)
redis.call('ZADD', KEYS[1], now + ttl, me)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ttl)
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if id ~= me then
    local lease = redis.call('HGETALL', KEYS[2] .. id)
    if #lease > 0 then out[#out + 1] = lease end
  end
end
return {redis.call('ZCARD', KEYS[1]), out}
""" % (_HSET_ARGS, _HSET_ARGS)  # noqa: UP031 (Lua's own braces)
LEAVE_SCRIPT = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2] .. ARGV[1])
"""


class SharedLoadBoard:
    """A LoadBoard (fleet/load_board.py) whose records count every gateway's requests."""

    def __init__(
        self,
        execute: Execute,
        namespace: str,
        gateway_id: str,
        clock: Callable[[], float],
        ttl_s: float = 2.0,
    ) -> None:
        self._execute = execute
        self._keys = (f"{namespace}:gateways", f"{namespace}:lease:")
        self.gateway_id = gateway_id
        self._clock = clock
        self._ttl_s = ttl_s
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._own: dict[str, BackendLoad] = {}  # this gateway's counts
        self._shown: dict[str, BackendLoad] = {}  # its counts and the others', as last read
        self._others: dict[str, tuple[int, int, int]] = {}
        self._watchers: list[Callable[[str, float], None]] = []  # told what a sync changed
        self.gateways = 1  # counting on this board, this one too, as the last sync heard
        self._counters: list[Callable[[int], None]] = []  # told when `gateways` changes
        self._heard_at: float | None = None  # the last sync Redis answered
        self.failures = 0  # syncs Redis did not answer
        self._down = False  # warned of this outage already

    # -- the LoadBoard protocol: memory only --------------------------------------------------

    def load(self, backend_id: str) -> BackendLoad:
        shown = self._shown.get(backend_id)
        if shown is None:
            shown = self._shown[backend_id] = BackendLoad()
        return shown

    def loads(self, backend_ids: Iterable[str]) -> list[BackendLoad]:
        get, load = self._shown.get, self.load
        return [get(backend) or load(backend) for backend in backend_ids]

    def begin(self, backend_id: str, prompt_tokens: int) -> BackendLoad:
        own = self._own.get(backend_id)
        if own is None:
            own = self._own[backend_id] = BackendLoad()
        own.in_flight += 1
        own.in_flight_tokens += prompt_tokens
        own.pending_prefill += prompt_tokens
        shown = self.load(backend_id)
        shown.in_flight += 1
        shown.in_flight_tokens += prompt_tokens
        shown.pending_prefill += prompt_tokens
        return shown

    def prefilled(self, backend_id: str, prompt_tokens: int) -> None:
        self._own[backend_id].pending_prefill -= prompt_tokens
        self._shown[backend_id].pending_prefill -= prompt_tokens

    def end(self, backend_id: str, prompt_tokens: int, unprefilled: int) -> BackendLoad:
        own = self._own[backend_id]
        own.in_flight -= 1
        own.in_flight_tokens -= prompt_tokens
        own.pending_prefill -= unprefilled
        shown = self._shown[backend_id]
        shown.in_flight -= 1
        shown.in_flight_tokens -= prompt_tokens
        shown.pending_prefill -= unprefilled
        return shown

    def forget(self, backend_id: str) -> None:
        self._own.pop(backend_id, None)
        self._shown.pop(backend_id, None)

    def own(self, backend_id: str) -> BackendLoad:
        return self._own.get(backend_id) or BackendLoad()

    def watch(self, changed: Callable[[str, float], None]) -> None:
        self._watchers.append(changed)

    def watch_gateways(self, changed: Callable[[int], None]) -> None:
        self._counters.append(changed)

    def unwatch_gateways(self, changed: Callable[[int], None]) -> None:
        if changed in self._counters:
            self._counters.remove(changed)

    def _count(self, gateways: int) -> None:
        if gateways != self.gateways:
            self.gateways = gateways
            for changed in self._counters:
                changed(gateways)

    def __len__(self) -> int:
        """Backends with a record."""
        return len(self._shown)

    # -- sharing ------------------------------------------------------------------------------

    @property
    def shared(self) -> bool:
        """The last sync reached Redis."""
        return not self._down and self._heard_at is not None

    async def sync(self) -> bool:
        """Publish this gateway's counts and read the others'; False when Redis did not
        answer (the board goes on, on what it last heard until that is ttl_s old)."""
        fields: list[str] = []
        for backend_id, own in self._own.items():
            if own.in_flight or own.pending_prefill:
                fields += (backend_id, f"{own.in_flight} {own.in_flight_tokens} "
                                       f"{own.pending_prefill}")  # fmt: skip
        try:
            gateways, leases = await self._execute(
                "EVAL", SYNC_SCRIPT, 2, *self._keys, self.gateway_id, self._ttl_ms, *fields
            )
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return False
        if self._down:
            log.warning("Redis answers again: the load board is shared again")
            self._down = False
        self._heard_at = self._clock()
        self._count(max(1, int(gateways)))
        self._show(_summed(leases))
        return True

    async def leave(self) -> None:
        """Take this gateway's lease off now, so the others stop counting it at once."""
        try:
            await self._execute("EVAL", LEAVE_SCRIPT, 2, *self._keys, self.gateway_id)
        except (RedisError, OSError) as exc:
            log.debug("leaving the shared load board failed: %s", exc)

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        if not self._down:
            self._down = True
            log.warning(
                "Redis did not answer (%s): the load board counts this gateway's own requests "
                "alone until it does", str(exc) or type(exc).__name__,
            )  # fmt: skip
        heard = self._heard_at
        if heard is None or self._clock() - heard >= self._ttl_s:
            self._count(1)  # what it last heard is older than any lease: alone
            if self._others:
                self._show({})

    def _show(self, others: dict[str, tuple[int, int, int]]) -> None:
        """Each shown record: this gateway's counts plus `others`."""
        zero, changed = _ZERO, []
        for backend_id in others.keys() | self._others.keys():
            if others.get(backend_id, zero) == self._others.get(backend_id, zero):
                continue
            shown = self.load(backend_id)
            own = self._own.get(backend_id)
            n, tokens, prefill = others.get(backend_id, zero)
            if own is not None:
                n, tokens = n + own.in_flight, tokens + own.in_flight_tokens
                prefill += own.pending_prefill
            shown.in_flight, shown.in_flight_tokens, shown.pending_prefill = n, tokens, prefill
            changed.append(backend_id)
        self._others = others
        if changed and self._watchers:
            now = self._clock()
            for backend_id in changed:
                for watcher in self._watchers:
                    watcher(backend_id, now)


_ZERO = (0, 0, 0)


def _summed(leases: list[list[bytes]]) -> dict[str, tuple[int, int, int]]:
    """The other gateways' counts, summed by backend id; a field that does not read as three
    integers is skipped (a lease of a different version)."""
    total: dict[str, tuple[int, int, int]] = {}
    for lease in leases:
        for i in range(0, len(lease) - 1, 2):
            try:
                backend_id = lease[i].decode()
                n, tokens, prefill = (int(part) for part in lease[i + 1].split())
            except ValueError:  # UnicodeDecodeError too
                continue
            was = total.get(backend_id, _ZERO)
            total[backend_id] = (was[0] + n, was[1] + tokens, was[2] + prefill)
    return total
