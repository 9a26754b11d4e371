"""Two gateways' batch books on one directory and one real Redis (batches/sharing.py): one at a
time runs the batches, whichever gateway they were made at; the other shows their counts and
passes a cancel on; and when the one running them dies, the other takes them over once its
lease lapses, every request answered exactly once. The requests are answered by a stand-in for
the gateway's request path (what the runner calls), which is not what is tested here."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from fleetgate.batches.book import BatchBook
from fleetgate.batches.files import FileShelf
from fleetgate.batches.runner import BatchRunner
from fleetgate.batches.settings import BatchesSettings
from fleetgate.batches.sharing import SharedBatches
from fleetgate.batches.store import BatchStore
from fleetgate.clock import LoopClock
from fleetgate.lifecycle.downstream import Downstream
from fleetgate.shared.changes import ChangeMark
from fleetgate.shared.lease import Lease
from fleetgate.traffic.door import Caller
from fleetgate.traffic.redis_cancel import Execute, cancellable
from tests.batches.test_batch_book import ALICE, ANSWER, CHAT, _input

LEASE_S = 2.0


class Gateway:
    """One gateway's batch book, runner and turns on the shared `root`."""

    def __init__(
        self, root: Path, client: Any, name: str, served: Counter[bytes],
        execute: Execute | None = None,
    ) -> None:  # fmt: skip
        self.name = name
        self.served = served
        self.store = BatchStore(root, random.Random(name))
        self.store.load()
        tenants = {"alice": ALICE}
        # As the gateway's shared state calls Redis.
        execute = execute or cancellable(client.execute_command)
        changes = ChangeMark(execute, "test:changes", LoopClock(), name)
        self.book = BatchBook(self.store, BatchesSettings(), tenants, time.time, changes=changes)
        self.shelf = FileShelf(self.store, BatchesSettings(), time.time)
        self.runner = BatchRunner(self.book, self.serve, 2, random.Random(0), LoopClock())
        self.lease = Lease(execute, "test:batches", name, LoopClock(), ttl_s=LEASE_S)
        self.sharing = SharedBatches(self.book, self.runner, self.lease, LoopClock(), 0.05)

    async def serve(self, caller: Caller, path: bytes, body: bytes, answer: Downstream) -> None:
        await asyncio.sleep(0.02)
        self.served[body] += 1
        answer.send(200, [(b"content-type", b"application/json")], ANSWER)

    async def create(self, n: int) -> str:
        file = await self.shelf.upload("alice", "in.jsonl", "batch", _input(n))
        await self.book.tell()  # as the Batch API does after each request
        await self.book.refresh()
        batch = await self.book.create(Caller(ALICE, ""), file.id, CHAT, "24h", None)
        await self.book.tell()
        return batch.id

    async def status(self, batch_id: str) -> str:
        await self.book.refresh()
        return self.book.get("alice", batch_id).status

    def die(self) -> None:
        """Stop at once, as a killed process: nothing handed on, its lease left to lapse."""
        for task in [*self.sharing._tasks, *self.runner._tasks]:
            task.cancel()


async def until(check: Callable[[], Any], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def markers(root: Path) -> list[Path]:
    return list(root.glob("batches/*.cancel"))


def custom_ids(gateway: Gateway, file_id: str | None) -> Counter[str]:
    assert file_id is not None
    lines = gateway.store.content(file_id).splitlines()
    return Counter(json.loads(line)["custom_id"] for line in lines)


async def test_one_gateway_runs_the_batches_made_at_either(tmp_path: Path, client: Any) -> None:
    served: Counter[bytes] = Counter()
    a, b = Gateway(tmp_path, client, "a", served), Gateway(tmp_path, client, "b", served)
    await a.sharing.renew()
    await b.sharing.renew()
    assert a.sharing.running_here and not b.sharing.running_here
    a.sharing.start()
    b.sharing.start()
    try:
        made = [await b.create(5), await a.create(5)]
        for batch_id in made:
            await until(lambda batch_id=batch_id: _ended(b, batch_id))
        for batch_id in made:
            batch = b.book.get("alice", batch_id)
            assert batch.request_counts.completed == 5
            assert custom_ids(b, batch.output_file_id) == {f"r{i}": 1 for i in range(5)}
        assert sum(served.values()) == 10 and set(served.values()) == {2}  # the same 5 twice
        assert not b.runner._tasks  # b never ran anything
    finally:
        await a.sharing.stop()
        await b.sharing.stop()


@asynccontextmanager
async def two_gateways(root: Path, client: Any) -> AsyncIterator[tuple[Gateway, Gateway]]:
    """Gateways a and b on `root`, both running, a holding the lease (it started first)."""
    served: Counter[bytes] = Counter()
    a, b = Gateway(root, client, "a", served), Gateway(root, client, "b", served)
    await a.sharing.renew()
    a.sharing.start()
    b.sharing.start()
    try:
        yield a, b
    finally:
        await a.sharing.stop()
        await b.sharing.stop()


async def _ended(gateway: Gateway, batch_id: str) -> bool:
    return await gateway.status(batch_id) in ("completed", "cancelled")


async def test_the_other_gateway_shows_the_counts_and_passes_a_cancel_on(
    tmp_path: Path, client: Any
) -> None:
    async with two_gateways(tmp_path, client) as (_, b):
        batch_id = await b.create(200)  # 2 at a time, 20 ms each: 2 s to run whole

        async def counted() -> bool:
            await b.book.refresh()
            return b.book.get("alice", batch_id).request_counts.completed > 0

        await until(counted)
        asked = b.book.cancel("alice", batch_id)
        await b.book.tell()
        assert asked.status == "cancelling"
        assert await b.status(batch_id) in ("cancelling", "cancelled")  # never in_progress
        await until(lambda: _ended(b, batch_id))
        batch = b.book.get("alice", batch_id)
        assert batch.status == "cancelled" and 0 < batch.request_counts.completed < 200
        assert not markers(tmp_path)  # gone with the batch's end


async def test_when_the_runner_dies_the_other_takes_its_batches_over(
    tmp_path: Path, client: Any
) -> None:
    async with two_gateways(tmp_path, client) as (a, b):
        served = a.served
        batch_id = await a.create(100)

        async def begun() -> bool:
            return sum(served.values()) >= 10

        await until(begun)
        a.die()
        died = time.monotonic()
        await until(lambda: _ended(b, batch_id))
        assert b.sharing.running_here
        assert time.monotonic() - died < LEASE_S + 2.0
        batch = b.book.get("alice", batch_id)
        assert custom_ids(b, batch.output_file_id) == {f"r{i}": 1 for i in range(100)}
        assert len(served) == 100  # every request ran; those cut off by the death ran again


async def test_a_runner_whose_redis_stops_answering_stops_before_its_lease_lapses(
    tmp_path: Path, client: Any
) -> None:
    """Redis slow, not down: each renewal times out after its whole budget. The runner stops
    while Redis still holds the lease for it, so no other gateway can have begun."""
    answering = True
    guarded = cancellable(client.execute_command)

    async def execute(*command: Any) -> Any:
        if not answering:
            await asyncio.sleep(60)
        return await guarded(*command)

    served: Counter[bytes] = Counter()
    a = Gateway(tmp_path, client, "a", served, execute)
    a.sharing.start()
    try:
        await until(lambda: _true(a.book.running_here))
        batch_id = await a.create(500)
        await until(lambda: _true(sum(served.values()) >= 5))
        answering = False
        stopped_at = None
        for _ in range(400):
            if not a.book.running_here:
                stopped_at = await client.pttl("test:batches")
                break
            await asyncio.sleep(0.01)
        assert stopped_at is not None and stopped_at > 0  # Redis still had it as a's
        count = sum(served.values())
        await asyncio.sleep(0.2)
        assert sum(served.values()) == count  # nothing ran after
        assert a.store.batches[batch_id].batch.status == "in_progress"
    finally:
        answering = True
        await a.sharing.stop()


async def _true(value: bool) -> bool:
    return value


async def test_a_gateway_looks_at_the_directory_only_when_another_changed_it(
    tmp_path: Path, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: Counter[bytes] = Counter()
    a, b = Gateway(tmp_path, client, "a", served), Gateway(tmp_path, client, "b", served)
    looks = 0
    refresh = b.store.refresh

    async def counted(keep: Any) -> None:
        nonlocal looks
        looks += 1
        await refresh(keep)

    monkeypatch.setattr(b.store, "refresh", counted)
    await b.book.refresh()
    await b.book.refresh()
    assert looks == 1  # nothing changed since the first
    file = await a.shelf.upload("alice", "in.jsonl", "batch", _input(1))
    await a.book.tell()
    await b.book.refresh()
    await b.book.refresh()
    assert looks == 2 and file.id in b.store.files
    await client.flushdb()  # Redis restarted empty: no mark it saw before
    await b.book.refresh()
    assert looks == 3


async def test_a_gateway_not_holding_the_lease_tries_once_a_look(
    tmp_path: Path, client: Any
) -> None:
    calls = 0
    guarded = cancellable(client.execute_command)

    async def execute(*command: Any) -> Any:
        nonlocal calls
        calls += command[0] == "EVAL"
        return await guarded(*command)

    served: Counter[bytes] = Counter()
    a = Gateway(tmp_path, client, "a", served)
    b = Gateway(tmp_path, client, "b", served, execute)
    await a.sharing.renew()
    b.sharing.start()
    try:
        await asyncio.sleep(0.5)  # every 0.05 s: about 10 tries, not a spin
        assert not b.book.running_here and 5 <= calls <= 15
    finally:
        await b.sharing.stop()
        await a.sharing.stop()
