"""A lease in Redis: one holder at a time among the gateways, for as long as it renews it.

    {key}   the holder's id, expiring `ttl_s` after its last renewal

`renew` takes the lease when it is free and extends it when this holder has it, in one Lua
call. The holder counts its hold from the moment it *sent* the renewal, less a margin, so it
gives the lease up by its own clock before Redis can hand it to another: Redis counts the same
`ttl_s` from when it received the call, which is later. A renewal that fails when the next
one could not be answered before the hold runs out gives the hold up at once: whoever acts on
the lease checks it once per renewal, and must not act past the lease's end. (A Redis that
loses the key, in a failover, may hand the lease to another while this holder still counts on
it: a lease is as good as the Redis that keeps it.) Redis slow or away is no renewal: the
hold runs out by itself, and nobody holds the lease until Redis is back.
"""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from fleetgate.clock import Clock
from fleetgate.traffic.redis_cancel import Execute

log = logging.getLogger(__name__)

RENEW_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Lease:
    """One holder's side of a lease (module docstring)."""

    def __init__(
        self,
        execute: Execute,
        key: str,
        holder: str,
        clock: Clock,
        *,
        ttl_s: float,
        budget_s: float = 0.5,
    ) -> None:
        if ttl_s < 4 * budget_s:
            raise ValueError(f"a lease of {ttl_s:g} s cannot be renewed within {budget_s:g} s")
        self._execute = execute
        self.key = key
        self._holder = holder
        self._clock = clock
        self._ttl_s = ttl_s
        self.budget_s = budget_s  # a renewal Redis has not answered by then failed
        self.until = float("-inf")  # on `clock`: when this holder's hold runs out
        self.failures = 0  # renewals Redis did not answer in time

    def held(self) -> bool:
        return self._clock.now() < self.until

    async def renew(self) -> bool:
        """Take the lease, or keep it: whether this holder has it now."""
        sent = self._clock.now()
        ttl_ms = str(round(self._ttl_s * 1000))
        try:
            renewal = self._execute("EVAL", RENEW_SCRIPT, 1, self.key, self._holder, ttl_ms)
            got = await self._clock.within(renewal, self.budget_s)
        except (RedisError, OSError, TimeoutError) as exc:
            self.failures += 1
            log.debug("lease %s not renewed: %s", self.key, exc)
            if self._clock.now() + self.budget_s >= self.until:  # the next could land too late
                self.until = float("-inf")
            return self.held()
        # The margin: a holder acts on its hold until it looks again, a budget later at most.
        self.until = sent + self._ttl_s - self.budget_s if got == 1 else float("-inf")
        return self.held()

    async def release(self) -> None:
        """Give the lease up now (if this holder has it), for another to take at once."""
        self.until = float("-inf")
        try:
            await self._clock.within(
                self._execute("EVAL", RELEASE_SCRIPT, 1, self.key, self._holder), self.budget_s
            )
        except (RedisError, OSError, TimeoutError) as exc:  # it lapses by itself
            log.debug("lease %s not released: %s", self.key, exc)
