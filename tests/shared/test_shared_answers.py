"""The response cache's answers in Redis (shared/answers.py), against a real redis-server: an
answer kept by one gateway found by another, one gateway computing while the others wait for
its answer, and Redis away a miss, never an error."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fleetgate.clock import LoopClock
from fleetgate.shared.answers import SharedAnswers
from fleetgate.traffic.redis_store import redis_client
from tests.redis_server import redis_server

KEY = b"\x01" * 32
HEADERS = [(b"content-type", b"application/json")]


def answers(client: Any, gateway_id: str, hold_s: float = 2.0) -> SharedAnswers:
    return SharedAnswers(client.execute_command, "test", gateway_id, LoopClock(), ttl_s=60,
                         hold_s=hold_s)  # fmt: skip


async def test_an_answer_kept_by_one_gateway_is_found_by_another(client: Any) -> None:
    a, b = answers(client, "gw-a"), answers(client, "gw-b")
    assert await b.get(KEY) is None
    await a.keep(KEY, HEADERS, b'{"ok":1}')
    kept = await b.get(KEY)
    assert kept is not None and (kept.headers, kept.body) == (HEADERS, b'{"ok":1}')


async def test_one_gateway_computes_while_the_others_wait_for_its_answer(client: Any) -> None:
    a, b, c = (answers(client, g) for g in ("gw-a", "gw-b", "gw-c"))
    assert await a.claim(KEY)
    assert not await b.claim(KEY) and not await c.claim(KEY)

    async def answer_later() -> None:
        await asyncio.sleep(0.1)
        await a.keep(KEY, HEADERS, b"done")

    waited = await asyncio.gather(b.wait(KEY), c.wait(KEY), answer_later())
    assert [w.body for w in waited[:2] if w is not None] == [b"done", b"done"]
    assert await b.claim(KEY)  # the flight is over: the next to miss goes itself


async def test_a_holder_that_gives_up_sends_the_waiters_on_their_way(client: Any) -> None:
    a, b = answers(client, "gw-a"), answers(client, "gw-b")
    assert await a.claim(KEY)
    waiting = asyncio.ensure_future(b.wait(KEY))
    await asyncio.sleep(0.05)
    await a.release(KEY)
    assert await waiting is None


async def test_a_wait_ends_at_the_coalescing_timeout(client: Any) -> None:
    a, b = answers(client, "gw-a"), answers(client, "gw-b", hold_s=0.2)
    assert await a.claim(KEY)
    started = asyncio.get_running_loop().time()
    assert await b.wait(KEY) is None
    assert 0.2 <= asyncio.get_running_loop().time() - started < 1.0


async def test_redis_away_is_a_miss_and_every_gateway_goes_itself(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server:
        client = redis_client(server.url)
        try:
            a = answers(client, "gw-a")
            server.kill()
            assert await a.get(KEY) is None
            assert await a.claim(KEY)  # go yourself
            await a.keep(KEY, HEADERS, b"x")  # nothing raised
            assert a.failures >= 3
        finally:
            await client.aclose()
