"""The guard around redis-py's `execute_command` (traffic/redis_cancel.py): a task cancelled
during a command ends cancelled, even when the client swallowed the cancel (as redis-py's
asyncio client does when it lands in its read timeout), with a real Redis as with a stand-in
that always swallows it; and a timeout around a guarded command still times out."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from fleetgate.traffic.redis_cancel import cancellable
from fleetgate.traffic.redis_store import redis_client
from tests.redis_server import RedisServer


async def swallowing(*command: Any) -> Any:
    """A client that swallows every cancel: it answers instead."""
    try:
        await asyncio.sleep(1)
    except asyncio.CancelledError:
        return b"OK"
    return b"slow"


async def test_a_cancel_the_client_swallowed_still_ends_the_task() -> None:
    task = asyncio.create_task(cancellable(swallowing)("GET", "k"))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    bare = asyncio.create_task(swallowing("GET", "k"))
    await asyncio.sleep(0)
    bare.cancel()
    assert await bare == b"OK"  # what the guard is for


async def test_an_error_is_its_own_when_no_cancel_came_during_the_call() -> None:
    """A task still counting an earlier cancel (one it caught, as cleanup code does) keeps
    its Redis errors: they are not taken for a cancel."""

    async def failing(*command: Any) -> Any:
        raise RedisConnectionError("Redis restarted")

    async def cleanup() -> str:
        try:
            await asyncio.sleep(1)
        except asyncio.CancelledError:  # cancelled once; goes on to clean up
            try:
                await cancellable(failing)("EVALSHA", "x")
            except RedisConnectionError:
                return "its own error"
        return "never cancelled"

    task = asyncio.create_task(cleanup())
    await asyncio.sleep(0)
    task.cancel()
    assert await task == "its own error"


async def test_a_timeout_around_a_guarded_command_times_out() -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await cancellable(swallowing)("GET", "k")


async def test_no_cancel_is_lost_on_a_real_redis(redis: RedisServer) -> None:
    client = redis_client(redis.url)
    execute = cancellable(client.execute_command)
    rng = random.Random(5)
    lost = 0
    try:
        for _ in range(500):
            task = asyncio.create_task(execute("GET", "k"))
            await asyncio.sleep(rng.random() * 0.0005)  # lands before, during or after it
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                continue
            lost += task.cancelling() > 0
    finally:
        await client.aclose()
    assert lost == 0
