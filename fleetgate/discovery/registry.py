"""The Redis registry: workers register themselves and keep a heartbeat; gateways read who is
there. Any engine's sidecar can speak it; `fleetgate worker sim --register URL` does.

    SET  {prefix}:worker:{id}  ENTRY  PX ttl     on start, then every `interval_s`
    SADD {prefix}:workers      {id}              (each time too: a reader may have just
                                                  dropped an id whose entry had expired)
    DEL {prefix}:worker:{id}; SREM {prefix}:workers {id}     on a clean stop
`id`: any printable text unique to the worker (the sim worker's host:port). ENTRY: a JSON
object with the keys of a discovered backend (`model`, `url`, and optionally `weight`,
`labels`, `ready`, `engine`, `max_in_flight`; docs/configuration.md, "Discovery"), at most
64 KiB. `ttl` is 3 heartbeat intervals: one late heartbeat does not drop a worker, a dead one
is gone within `ttl` of its last. Expiry is Redis's own clock, so the workers' and gateways'
clocks need not agree.

A gateway reads SMEMBERS, then MGET of their entries, every `interval_s`; an id whose entry
has expired is gone, and is removed from the set. An entry that does not decode or fails its
checks is skipped (logged once per id). Whoever can write to this Redis can point the
gateways at any server: give it the trust the config file has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from urllib.parse import urlsplit

import msgspec
import redis.asyncio as aioredis

from fleetgate.discovery.found import Found, SourceError
from fleetgate.traffic.redis_store import REDIS_FAILURES, redis_client

log = logging.getLogger("fleetgate.discovery")

MAX_ENTRY_BYTES = 64 * 1024
# Removes from the set (KEYS[1]) each id (ARGV[i]) whose entry (KEYS[i + 1]) is still gone: a
# worker that renewed its entry since it was read expired keeps its place.
_DROP_EXPIRED = """
for i, id in ipairs(ARGV) do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then redis.call('SREM', KEYS[1], id) end
end
return 0
"""
TTL_BEATS = 3  # an entry outlives this many heartbeat intervals


def _server(url: str) -> str:
    """Which Redis, without credentials: HOST:PORT/DB, or a unix socket's path."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname}:{parts.port or 6379}/{parts.path.lstrip('/') or '0'}"


def workers_key(prefix: str) -> str:
    return f"{prefix}:workers"


def entry_key(prefix: str, worker_id: str) -> str:
    return f"{prefix}:worker:{worker_id}"


class RedisRegistry:
    """The workers registered in the Redis at `url` (a discovery source)."""

    def __init__(self, url: str, prefix: str, interval_s: float) -> None:
        self._redis = redis_client(url)
        self._prefix = prefix
        self._where = _server(url)
        self._interval_s = interval_s
        self._refused: set[str] = set()  # ids whose entry was refused (logged once)

    @property
    def name(self) -> str:
        return f"redis:{self._where}:{self._prefix}"  # never the URL: it may hold a password

    @property
    def interval_s(self) -> float:
        return self._interval_s

    async def read(self) -> Sequence[Found]:
        members = workers_key(self._prefix)
        try:
            listed = await self._redis.smembers(members)  # type: ignore[misc]
            ids = sorted(i.decode(errors="replace") for i in listed)
            entries = (
                await self._redis.mget([entry_key(self._prefix, i) for i in ids]) if ids else []
            )
        except REDIS_FAILURES as exc:
            raise SourceError(f"{self.name}: {exc}") from None
        found, expired = [], []
        for worker_id, entry in zip(ids, entries, strict=True):
            if entry is None:
                expired.append(worker_id)
                continue
            try:
                if len(entry) > MAX_ENTRY_BYTES:
                    raise ValueError(f"over {MAX_ENTRY_BYTES} bytes")
                found.append(msgspec.json.decode(entry, type=Found))
            except (ValueError, msgspec.DecodeError, msgspec.ValidationError) as exc:
                if worker_id not in self._refused:
                    self._refused.add(worker_id)
                    log.warning("discovery: %s: worker %r skipped: %s", self.name, worker_id, exc)
        if expired:
            keys = [members, *(entry_key(self._prefix, i) for i in expired)]
            with contextlib.suppress(*REDIS_FAILURES):  # else removed at a later read
                await self._redis.eval(_DROP_EXPIRED, len(keys), *keys, *expired)  # type: ignore[misc]
        return found

    async def close(self) -> None:
        await self._redis.aclose()


class Registration:
    """One worker's entry in the registry, kept alive by a heartbeat until `leave`."""

    def __init__(
        self, client: aioredis.Redis, prefix: str, worker_id: str, entry: Found, interval_s: float
    ) -> None:
        self._redis = client
        self._members = workers_key(prefix)
        self._key = entry_key(prefix, worker_id)
        self._id = worker_id
        self._entry = msgspec.json.encode(entry)
        self._interval_s = interval_s

    async def beat(self) -> None:
        """Register, or say it is still alive (REDIS_FAILURES when Redis cannot be reached)."""
        ttl_ms = int(self._interval_s * TTL_BEATS * 1000)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._key, self._entry, px=ttl_ms)
            pipe.sadd(self._members, self._id)
            await pipe.execute()

    async def run(self) -> None:
        """Beat every interval until cancelled; Redis away is waited out, said once."""
        away = False
        while True:
            try:
                await self.beat()
                away = False
            except REDIS_FAILURES as exc:
                if not away:
                    log.warning("registry: cannot reach Redis, still trying: %s", exc)
                away = True
            await asyncio.sleep(self._interval_s)

    async def leave(self) -> None:
        """Leave at once (a clean stop), rather than when the entry expires."""
        with contextlib.suppress(*REDIS_FAILURES):  # else it expires by itself
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(self._key)
                pipe.srem(self._members, self._id)
                await pipe.execute()

    async def close(self) -> None:
        await self._redis.aclose()
