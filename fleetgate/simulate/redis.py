"""The Redis that simulated gateways share their routing state through (shared/): in memory,
on the virtual clock, each command answered after the round trip from the gateway's region.

It knows the commands the shared routing state sends, no others: the load board's sync and
leave scripts (shared/load_board.py: each gateway's counts as a lease that lapses after its
TTL, every gateway reading the others'), XADD / XREAD of the decision streams
(shared/stream.py: the prefix index's, sessions' and Responses pins' decisions), and a
lease's renewal and release (shared/lease.py: the autoscaler's, one gateway acting). So the
gateways run their real sharing code, and the lag between them is the scenario's: the sync
intervals of their `state:` config plus the round trip (`state_rtt_ms`)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from fleetgate.clock import Clock
from fleetgate.shared.lease import RELEASE_SCRIPT, RENEW_SCRIPT
from fleetgate.shared.load_board import LEAVE_SCRIPT, SYNC_SCRIPT

Execute = Callable[..., Awaitable[Any]]


class SimRedis:
    """One Redis for every simulated gateway."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._leases: dict[bytes, dict[bytes, tuple[float, list[bytes]]]] = {}  # board -> gw
        self._streams: dict[bytes, list[tuple[bytes, dict[bytes, bytes]]]] = {}
        self._numbers: dict[bytes, list[int]] = {}  # each stream's entry ids, as numbers
        self._ids = itertools.count(1)
        self._holders: dict[bytes, tuple[bytes, float]] = {}  # lease key -> holder, lapses at

    def client(self, rtt_s: float) -> Execute:
        """The `execute` of a gateway whose commands take `rtt_s` there and back."""

        async def execute(*command: Any) -> Any:
            if rtt_s:
                await self._clock.sleep(rtt_s)
            return self.run(*command)

        return execute

    def run(self, *command: Any) -> Any:
        """Answer one command now, as Redis would."""
        name = command[0]
        if name == "EVAL" and command[1] == SYNC_SCRIPT:
            return self._sync(_b(command[3]), _b(command[5]), int(command[6]), command[7:])
        if name == "EVAL" and command[1] == LEAVE_SCRIPT:
            self._leases.get(_b(command[3]), {}).pop(_b(command[5]), None)
            return None
        if name == "EVAL" and command[1] in (RENEW_SCRIPT, RELEASE_SCRIPT):  # 1 key holder [ttl_ms]
            return self._lease(
                command[1] == RENEW_SCRIPT, _b(command[3]), _b(command[4]), command[5:]
            )
        if name == "XADD":  # key MAXLEN ~ keep * field value ...
            key, keep, fields = _b(command[1]), int(command[4]), command[6:]
            entries = self._streams.setdefault(key, [])
            numbers = self._numbers.setdefault(key, [])
            number = next(self._ids)
            entries.append((b"%d-0" % number, _pairs(fields)))
            numbers.append(number)
            if len(entries) > 2 * keep:  # trimmed now and then, as MAXLEN ~ does
                del entries[: len(entries) - keep], numbers[: len(numbers) - keep]
            return entries[-1][0]
        if name == "XREAD":  # COUNT n STREAMS key last
            count, key, last = int(command[2]), _b(command[4]), _b(command[5])
            start = bisect.bisect_right(self._numbers.get(key, []), _id(last))
            newer = self._streams.get(key, [])[start : start + count]
            return [[key, newer]] if newer else []
        raise NotImplementedError(f"the simulated Redis does not know {name!r}")

    def _lease(self, renew: bool, key: bytes, holder: bytes, ttl: tuple[Any, ...]) -> int:
        now = self._clock.now()
        held = self._holders.get(key)
        if held is not None and held[1] <= now:
            held = None
        if not renew:
            if held is not None and held[0] == holder:
                del self._holders[key]
                return 1
            return 0
        if held is None or held[0] == holder:
            self._holders[key] = (holder, now + int(ttl[0]) / 1000)
            return 1
        return 0

    def _sync(self, board: bytes, me: bytes, ttl_ms: int, fields: tuple[Any, ...]) -> Any:
        now = self._clock.now()
        leases = self._leases.setdefault(board, {})
        for gateway, (lapses, _) in list(leases.items()):
            if lapses <= now:
                del leases[gateway]
        leases[me] = (now + ttl_ms / 1000, [_b(f) for f in fields])
        others = [lease for gateway, (_, lease) in leases.items() if gateway != me and lease]
        return [len(leases), others]


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _pairs(fields: tuple[Any, ...]) -> dict[bytes, bytes]:
    return {_b(fields[i]): _b(fields[i + 1]) for i in range(0, len(fields) - 1, 2)}


def _id(entry_id: bytes) -> int:
    return int(entry_id.split(b"-")[0])
