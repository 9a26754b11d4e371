"""The runner over a real gateway built by the composition root (a mock transport in place of
the network), in virtual time (tests/virtual_time.py): a 503 with Retry-After is
tried again once that time has passed, a batch cancelled meanwhile leaves it unrun, a tenant
over its rate limit holds no worker, and a tenant gone from the config gets an error line
instead of a run."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetgate.batches.book import BatchBook
from fleetgate.batches.files import FileShelf
from fleetgate.batches.runner import BatchRunner
from fleetgate.batches.settings import BatchesSettings
from fleetgate.batches.store import BatchStore
from fleetgate.clock import LoopClock
from fleetgate.config import parse_config
from fleetgate.fleet.backend import Backend
from fleetgate.http.mock import MockTransport, Script, Sent
from fleetgate.serve import ResolvedPool, compose
from fleetgate.traffic.door import Caller
from fleetgate.traffic.keys import digest_of
from fleetgate.traffic.tenants import Tenant, TenantSettings
from tests.batches.test_batch_book import CHAT, _input
from tests.batches.test_batch_store import SEED
from tests.virtual_time import in_virtual_time

ANSWER = json.dumps({"id": "c", "choices": [{"message": {"content": "hi"}}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()  # fmt: skip
JSON = [(b"content-type", b"application/json")]
URL = "http://127.0.0.1:9"
WALL = 1_000_000.0  # the book's wall clock at virtual time 0


class Setup:
    """A gateway and its batch runner on the virtual-time loop of `clock` (the book's wall
    clock is that time too, from WALL)."""

    def __init__(
        self, root: Path, clock: LoopClock, answer: Callable[[Sent], Script],
        tenants: list[str], limits: dict[str, dict[str, float]] | None = None,
    ) -> None:  # fmt: skip
        config = parse_config({
            "pools": [{"model": "m", "backends": [{"url": URL}], "retries": {"max_attempts": 1},
                       "health_check": {"enabled": False}, "engine_metrics": {"enabled": False}}],
            "tenants": [{"name": t, "keys": [f"sk-{t}-runner-key"],
                         "limits": (limits or {}).get(t, {})} for t in tenants],
            "batches": {"dir": str(root)},
        })  # fmt: skip
        self.store = BatchStore(root, random.Random(SEED))
        self.store.load()
        self.clock = clock
        self.transport = MockTransport(answer, clock)
        gateway, _ = compose(
            config, [ResolvedPool(config.pools[0], (Backend("b", URL, ("m",)),))],
            transport=self.transport, clock=clock, rng=random.Random(0),
            wall_clock=self.wall, batch_store=self.store,
        )  # fmt: skip
        book = gateway.batch_book
        assert book is not None
        self.book: BatchBook = book
        self.runner = BatchRunner(book, gateway.inference.serve_as, 2, random.Random(0), clock)

    def wall(self) -> float:
        return WALL + self.clock.now()

    async def start(self, n: int, owner: str = "alice") -> str:
        tenant = Tenant.of(TenantSettings(name=owner))
        shelf = FileShelf(self.store, BatchesSettings(), self.wall)
        file = await shelf.upload(owner, "in.jsonl", "batch", _input(n))
        key_id = digest_of(f"sk-{owner}-runner-key").hex()[:16]  # as the front door's
        return (await self.book.create(Caller(tenant, key_id), file.id, CHAT, "24h", None)).id

    async def ended(self, batch_id: str, owner: str = "alice") -> str:
        """Let the runner work until the batch ends (each look a tenth of a second later)."""
        for _ in range(10_000):
            status = self.book.get(owner, batch_id).status
            if status in ("completed", "cancelled", "expired"):
                return status
            await self.clock.sleep(0.1)
        raise AssertionError(f"still {status}")


def lines(setup: Setup, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) for line in setup.store.content(file_id).splitlines()]


@in_virtual_time
async def test_a_503_is_tried_again_once_its_retry_after_has_passed(
    clock: LoopClock, tmp_path: Path
) -> None:
    answers = iter([Script(503, [b'{"error":{}}'], [*JSON, (b"retry-after", b"3")])])
    sent_at: list[float] = []

    def answer(sent: Sent) -> Script:
        sent_at.append(clock.now())
        return next(answers, Script(200, [ANSWER], JSON))

    setup = Setup(tmp_path, clock, answer, ["alice"])
    batch_id = await setup.start(2)
    setup.runner.start()
    try:
        assert await setup.ended(batch_id) == "completed"
    finally:
        await setup.runner.stop()
    batch = setup.book.get("alice", batch_id)
    assert batch.request_counts.completed == 2 and batch.error_file_id is None
    assert len(setup.transport.sent) == 3  # the 503's request went again
    assert 3.0 <= sent_at[-1] - sent_at[0] <= 3.6  # Retry-After: 3, jittered up to 20 %
    assert all(name != b"x-fleetgate-lane" for s in setup.transport.sent for name, _ in s.headers)


@in_virtual_time
async def test_a_batch_cancelled_while_a_request_waits_leaves_it_unrun(
    clock: LoopClock, tmp_path: Path
) -> None:
    sent = asyncio.Event()

    def answer(_: Sent) -> Script:
        sent.set()
        return Script(503, [b"{}"], [*JSON, (b"retry-after", b"60")])

    setup = Setup(tmp_path, clock, answer, ["alice"])
    batch_id = await setup.start(1)
    setup.runner.start()
    try:
        await sent.wait()
        setup.book.cancel("alice", batch_id)
        assert await setup.ended(batch_id) == "cancelled"
    finally:
        await setup.runner.stop()
    batch = setup.book.get("alice", batch_id)
    assert batch.output_file_id is None and batch.error_file_id is None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (0, 0)


@in_virtual_time
async def test_a_tenant_over_its_rate_limit_holds_no_worker(
    clock: LoopClock, tmp_path: Path
) -> None:
    # alice may send one request a minute: the rest of her batch is answered 429 by the
    # gateway itself. A worker that waited there would hold bob's batch up for a minute.
    setup = Setup(tmp_path, clock, lambda sent: Script(200, [ANSWER], JSON), ["alice", "bob"],
                  limits={"alice": {"requests_per_minute": 1}})  # fmt: skip
    alices = await setup.start(4, owner="alice")
    bobs = await setup.start(4, owner="bob")
    setup.runner.start()
    try:
        assert await setup.ended(bobs, owner="bob") == "completed"
        assert clock.now() < 1.0  # at once, not after alice's minute
    finally:
        await setup.runner.stop()
    alice = setup.book.get("alice", alices)
    assert alice.status == "in_progress" and alice.request_counts.completed == 1
    assert alice.error_file_id is None  # a 429 is not an answer: no line


@in_virtual_time
async def test_a_tenant_gone_from_the_config_gets_an_error_line(
    clock: LoopClock, tmp_path: Path
) -> None:
    setup = Setup(tmp_path, clock, lambda sent: Script(200, [ANSWER], JSON), ["bob"])
    batch_id = await setup.start(2, owner="alice")  # alice's batch, made before she was removed
    setup.runner.start()
    try:
        assert await setup.ended(batch_id) == "completed"
    finally:
        await setup.runner.stop()
    batch = setup.book.get("alice", batch_id)
    errors = lines(setup, batch.error_file_id)
    assert [e["error"]["code"] for e in errors] == ["tenant_not_found"] * 2
    assert "'alice'" in errors[0]["error"]["message"] and not setup.transport.sent
