"""The mark of a shared thing's last change (shared/changes.py) on a real Redis: none before
the first change, a new one at each, and unknown (look anyway) while Redis does not answer."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from fleetgate.clock import LoopClock
from fleetgate.shared.changes import ChangeMark

KEY = "test:changes:batches:d"


async def test_each_change_sets_a_mark_no_reader_saw_before(client: Any) -> None:
    a = ChangeMark(client.execute_command, KEY, LoopClock(), "gw-a")
    b = ChangeMark(client.execute_command, KEY, LoopClock(), "gw-b")
    assert await a.read() == b""
    marks = set()
    for writer in (a, b, a, b):
        assert await writer.changed()
        mark = await a.read()
        assert mark and mark not in marks and await b.read() == mark
        marks.add(mark)


async def test_redis_away_is_an_unknown_mark_and_a_change_not_taken() -> None:
    async def away(*command: Any) -> Any:
        raise RedisConnectionError("Redis is away")

    mark = ChangeMark(away, KEY, LoopClock(), "gw-a")
    assert await mark.read() is None
    assert not await mark.changed()
    assert mark.failures == 2
