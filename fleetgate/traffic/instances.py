"""How many gateways share one Redis: each registers itself with a heartbeat, so that when
Redis goes away each can enforce its share of a limit alone (traffic/redis_store.py).

The gateways live in one sorted set, `{prefix}:instances`, each a member (a random id) whose
score is when its registration lapses, in Redis's own milliseconds:

    every interval_s:   ZADD set (redis now + ttl_s) id;  ZREMRANGEBYSCORE set -inf (redis now)
    count = ZCARD set   (the gateways heard from within the last ttl_s, this one included)

One script does it all, so the count is never of a half-pruned set, and no gateway's clock is
read: gateways with skewed clocks agree on who has lapsed. A sorted set rather than one key per
gateway counted with SCAN: a count is one O(log n) call, not a walk over the keyspace. A gateway
that stops leaves at once (ZREM); one that dies lapses after ttl_s.
"""

from __future__ import annotations

import logging
import random

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from fleetgate.clock import Clock
from fleetgate.fleet.periodic import PeriodicTasks
from fleetgate.traffic.redis_cancel import cancellable

log = logging.getLogger(__name__)

_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])
"""


class InstanceCount:
    """This gateway's registration, and the number of gateways last seen (1 until the first
    heartbeat answers: alone is the safe guess, it never lets one gateway exceed a limit)."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        instance_id: str,
        rng: random.Random,
        clock: Clock,
        interval_s: float = 2.0,
        ttl_s: float = 6.0,  # three missed heartbeats before a gateway is counted out
    ) -> None:
        self._client = client
        # redis-py's typed commands do not say they are coroutines in its asyncio client.
        self._execute = cancellable(client.execute_command)
        self.key = f"{prefix}:instances"
        self.instance_id = instance_id
        self._interval_s = interval_s
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._tasks = PeriodicTasks(rng, clock)
        self.count = 1

    def start(self) -> None:
        """Heartbeat from now until `stop()` (the first at once)."""
        self._tasks.every(self._interval_s, 0.1, self.beat, wait_first=False)

    async def beat(self) -> None:
        """Register (again) and count the gateways; the last count stays if Redis is down
        (the store that uses it says so: no warning from here, once per outage is enough)."""
        try:
            count = await self._execute("EVAL", _BEAT, 1, self.key, self.instance_id, self._ttl_ms)
        except (RedisError, OSError) as exc:
            log.debug("gateway heartbeat to Redis failed: %s", exc)
            return
        self.count = max(1, int(count))

    async def stop(self) -> None:
        """Stop the heartbeat and leave the set, so the others' shares grow at once."""
        self._tasks.stop()
        try:
            await self._execute("ZREM", self.key, self.instance_id)
        except (RedisError, OSError) as exc:
            log.debug("leaving the gateways' set in Redis failed: %s", exc)
