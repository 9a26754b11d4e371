"""Rate-limit and budget buckets in Redis, so that several gateways enforce one limit between
them (`limits.store: redis`), with MemoryStore's semantics (traffic/store.py) and its `Taken`.

Each operation is one Lua script (EVALSHA; EVAL when Redis answers NOSCRIPT, having restarted or
been flushed), so a take over several buckets is atomic across gateways: no other gateway's take
runs between reading the levels and writing them. Time is Redis's own (`redis.call('TIME')`),
not injected and not the gateways', whose clocks may disagree: a bucket refills by what Redis's
clock says has passed. A bucket is a hash {l: level, t: when}, whose PEXPIRE is when it is full
again (or, for a budget, `ttl_s`): an idle bucket vanishes, and a forgotten bucket is full.

When Redis fails (an error, or no answer within TIMEOUT_S) requests do not: each take and give
goes to a MemoryStore of this gateway's share of every limit (capacity and rate divided by the
gateways last counted, traffic/instances.py), with one warning when the outage starts and one
when it ends; Redis is tried again after `backoff_s` by one request at a time, never by every
request. The share starts full, and what a request reserved in one store is reconciled in the
store that answers when it ends: an outage costs a little accuracy, never an answer.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from fleetgate.traffic.instances import InstanceCount
from fleetgate.traffic.redis_cancel import cancellable
from fleetgate.traffic.store import Bucket, BucketsAccount, MemoryStore, Taken, wait_for

log = logging.getLogger(__name__)

TIMEOUT_S = 0.25  # connect and command: a dead Redis must not hold a request longer
BACKOFF_S = 1.0  # between tries of a Redis that failed

# KEYS[i] is bucket i; ARGV[4i-3 .. 4i] its capacity, rate per s, ttl_s and cost (or amount).
_COMMON = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local function level(i)  -- min(capacity, level then + rate * (now - then)); full if unknown
  local cap, rate = tonumber(ARGV[4 * i - 3]), tonumber(ARGV[4 * i - 2])
  local cell = redis.call('HMGET', KEYS[i], 'l', 't')
  if not cell[1] then return cap end
  local l = tonumber(cell[1]) + rate * math.max(0, now - tonumber(cell[2]))
  if l > cap then return cap end
  return l
end
local function keep(i, l)  -- until full again ((capacity - level) / rate), or ttl_s
  local cap, rate, ttl = tonumber(ARGV[4 * i - 3]), tonumber(ARGV[4 * i - 2]), ARGV[4 * i - 1]
  redis.call('HSET', KEYS[i], 'l', string.format('%.17g', l), 't', string.format('%.17g', now))
  local live_s = tonumber(ttl)
  if rate > 0 then live_s = (cap - l) / rate end
  redis.call('PEXPIRE', KEYS[i], math.ceil(live_s * 1000))  -- <= 0 deletes: full now
end
"""

# Replies {1 if taken else 0, level of each bucket after (before, when refused)}, the levels as
# text: Redis would truncate a Lua number to an integer.
_TAKE = (
    _COMMON
    + """
local levels, short = {}, false
for i = 1, #KEYS do
  levels[i] = level(i)
  if levels[i] < tonumber(ARGV[4 * i]) then short = true end
end
local reply = {short and 0 or 1}
for i = 1, #KEYS do
  if not short then
    levels[i] = levels[i] - tonumber(ARGV[4 * i])
    keep(i, levels[i])
  end
  reply[i + 1] = string.format('%.17g', levels[i])
end
return reply
"""
)

# Replies {} (nothing to say; an array, as every reply of this store's scripts).
_GIVE = (
    _COMMON
    + """
for i = 1, #KEYS do
  keep(i, math.min(tonumber(ARGV[4 * i - 3]), level(i) + tonumber(ARGV[4 * i])))
end
return {}
"""
)

_SHA = {script: hashlib.sha1(script.encode()).hexdigest() for script in (_TAKE, _GIVE)}
# What a call to Redis may raise when Redis dies under it: its own errors, a socket's, and
# what the client's parser lets through from a reply cut off mid-way (an EOFError such as
# asyncio's IncompleteReadError, a RuntimeError from a reader torn down while read). A
# request must never fail because Redis did, so each of these falls back to the shares.
REDIS_FAILURES = (RedisError, OSError, EOFError, RuntimeError)


def redis_client(url: str) -> aioredis.Redis:
    """A client that gives up on a dead Redis within TIMEOUT_S and never retries by itself
    (the store falls back at once, and retries on its own schedule)."""
    client: aioredis.Redis = aioredis.Redis.from_url(
        url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )  # fmt: skip
    return client


class RedisStore:
    """Buckets shared through Redis; this gateway's share of each in memory while it is down."""

    def __init__(
        self,
        client: aioredis.Redis,
        instances: InstanceCount,
        clock: Callable[[], float],  # the fallback's and the backoff's, never the buckets'
        backoff_s: float = BACKOFF_S,
    ) -> None:
        self._client = client
        # redis-py's typed commands do not say they are coroutines in its asyncio client.
        self._execute = cancellable(client.execute_command)
        self._instances = instances
        self._clock = clock
        self._backoff_s = backoff_s
        self._fallback = MemoryStore(clock)
        self._shares: dict[tuple[Bucket, int], Bucket] = {}
        self._down_since: float | None = None  # by `clock`; None: Redis answers
        self._retry_at = 0.0
        self._retrying = False

    @property
    def shared(self) -> bool:
        """Whether Redis answered the last time it was asked."""
        return self._down_since is None

    def start(self) -> None:
        """Begin counting the gateways (needs a running event loop)."""
        self._instances.start()

    async def close(self) -> None:
        await self._instances.stop()
        await self._client.aclose()

    async def take(self, buckets: Sequence[Bucket], costs: Sequence[float]) -> Taken:
        reply = await self._run(_TAKE, buckets, costs)
        if reply is None:
            return await self._fallback.take(self._share(buckets), costs)
        levels = [float(level) for level in reply[1:]]
        if reply[0] == 1:
            return Taken(True, levels, 0.0)
        wait = max(
            wait_for(level, cost, bucket.rate_per_s)
            for bucket, level, cost in zip(buckets, levels, costs)  # noqa: B905 (same length)
        )
        return Taken(False, levels, wait)

    def account(self, requests: Sequence[Bucket], sized: Sequence[Bucket]) -> BucketsAccount:
        return BucketsAccount(self, requests, sized)

    async def give(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> None:
        if await self._run(_GIVE, buckets, amounts) is None:
            await self._fallback.give(self._share(buckets), amounts)

    async def _run(
        self, script: str, buckets: Sequence[Bucket], values: Sequence[float]
    ) -> list[Any] | None:
        """The script's reply, or None when Redis is not to be asked or failed."""
        retry = self._down_since is not None
        if retry:
            if self._retrying or self._clock() < self._retry_at:
                return None
            self._retrying = True  # this request tries Redis again; the others keep away
        args: list[Any] = [len(buckets)]
        args += [bucket.key for bucket in buckets]
        for bucket, value in zip(buckets, values):  # noqa: B905 (same length)
            args += (bucket.capacity, bucket.rate_per_s, bucket.ttl_s, value)
        try:
            try:
                reply: list[Any] = await self._execute("EVALSHA", _SHA[script], *args)
            except NoScriptError:  # Redis restarted or was flushed: EVAL caches it again
                reply = await self._execute("EVAL", script, *args)
        except REDIS_FAILURES as exc:
            self._failed(exc)
            return None
        finally:
            if retry:
                self._retrying = False
        if self._down_since is not None:
            self._recovered()
        return reply

    def _failed(self, exc: Exception) -> None:
        now = self._clock()
        self._retry_at = now + self._backoff_s
        if self._down_since is None:
            self._down_since = now
            log.warning(
                "Redis failed (%s: %s): rate limits are counted by this gateway alone, at its "
                "share (1/%d) of each, until Redis answers again (tried every %g s)",
                type(exc).__name__, exc, self._instances.count, self._backoff_s,
            )  # fmt: skip

    def _recovered(self) -> None:
        assert self._down_since is not None
        log.warning(
            "Redis answers again after %.1f s: rate limits are shared by the gateways again",
            self._clock() - self._down_since,
        )
        self._down_since = None
        self._shares.clear()

    def _share(self, buckets: Sequence[Bucket]) -> list[Bucket]:
        """This gateway's share of each bucket: its capacity and rate over the gateways."""
        n = self._instances.count
        shares = []
        for bucket in buckets:
            share = self._shares.get((bucket, n))
            if share is None:
                share = Bucket(bucket.key, bucket.capacity / n, bucket.rate_per_s / n,
                               bucket.ttl_s)  # fmt: skip
                self._shares[bucket, n] = share
            shares.append(share)
        return shares
