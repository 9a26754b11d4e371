"""A guard around redis-py's asyncio client, for every caller of its `execute_command`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Execute = Callable[..., Awaitable[Any]]


def cancellable(execute: Execute) -> Execute:
    """A client's `execute_command` that never swallows a cancellation. redis-py's asyncio
    client can: a cancel that lands inside its read timeout is lost, the command returns, and
    the task goes on as if never cancelled (redis/redis-py#2028, #2551; about one cancel in
    five here), so a sync loop would outlive its gateway's close."""

    async def call(*command: Any) -> Any:
        task = asyncio.current_task()
        before = 0 if task is None else task.cancelling()
        try:
            return await execute(*command)
        finally:  # a cancel came during the call: its reply, or the error it made of it, goes
            if task is not None and task.cancelling() > before:
                raise asyncio.CancelledError

    return call
