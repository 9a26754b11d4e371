"""A mark of the last change made to something several gateways keep apart from Redis (a
shared batch directory): each sets a new mark after it changes the thing; each reads the mark
before it looks, and skips the look when the mark is the one it saw at its last. So a look that
costs a stat per object (batches/scan.py) is taken once per change, not once per request.

    {key}   the last change's mark: its gateway's id and how many changes it had marked, so
            no mark is ever set twice (a Redis restarted empty shows none a reader saw)

Redis slow or away is an unknown mark (None): the reader looks every time, as if nothing were
shared. A writer that could not set its mark sets one at its next try (`changed` says whether
it did): until then, the others may miss its change.
"""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from fleetgate.clock import Clock
from fleetgate.traffic.redis_cancel import Execute

log = logging.getLogger(__name__)


class ChangeMark:
    """The mark of one thing's last change (module docstring)."""

    def __init__(
        self, execute: Execute, key: str, clock: Clock, writer: str, budget_s: float = 0.2
    ) -> None:
        self._execute = execute
        self.key = key
        self._clock = clock
        self._writer = writer  # this gateway's id: unique to it
        self._marked = 0  # the marks it set
        self._budget_s = budget_s
        self.failures = 0  # calls Redis did not answer in time

    async def read(self) -> bytes | None:
        """The mark now (b"" when none was set); None when not known: look anyway."""
        try:
            raw = await self._clock.within(self._execute("GET", self.key), self._budget_s)
        except (RedisError, OSError, TimeoutError) as exc:
            self.failures += 1
            log.debug("change mark %s not read: %s", self.key, exc)
            return None
        return bytes(raw or b"")

    async def changed(self) -> bool:
        """A new mark, for a change made before this call: whether Redis took it."""
        self._marked += 1
        mark = f"{self._writer}:{self._marked}"
        try:
            await self._clock.within(self._execute("SET", self.key, mark), self._budget_s)
        except (RedisError, OSError, TimeoutError) as exc:
            self.failures += 1
            log.debug("change mark %s not set: %s", self.key, exc)
            return False
        return True
