"""The in-flight counts and the decisions are synced on timers of their own: the counts every
`load_sync_s` (they change with every request), the decisions every `sync_s`."""

from __future__ import annotations

import asyncio
import random
import time

from fleetgate.clock import LoopClock
from fleetgate.shared.state import RoutingState, StateSettings
from tests.redis_server import RedisServer


async def test_counts_are_shared_at_their_own_pace_decisions_at_theirs(
    redis: RedisServer,
) -> None:
    settings = StateSettings(url=redis.url, load_sync_s=0.01, sync_s=30.0)
    a, b = (RoutingState(settings, LoopClock(), random.Random(n)) for n in range(2))
    boards = [a.load_board("m"), b.load_board("m")]
    tables = [a.sessions("m"), b.sessions("m")]
    a.start()
    b.start()
    try:
        await asyncio.sleep(0.1)  # the first syncs of both, decisions too, are done
        boards[0].begin("b1", 10)
        tables[0].record("s", "b1")
        started = time.monotonic()
        for _ in range(400):  # 2 s at most
            if boards[1].load("b1").in_flight:
                break
            await asyncio.sleep(0.005)
        seen_after = time.monotonic() - started
        assert boards[1].load("b1").in_flight == 1
        assert seen_after < 0.5  # within a few load syncs (0.01 s each) on a loaded CI box
        assert tables[1].home("s") is None  # the next decisions' sync is 30 s away
    finally:
        await a.close()
        await b.close()
