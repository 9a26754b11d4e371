"""Which gateway runs the batches of a directory that several share: the one holding the
directory's lease in Redis (shared/lease.py), so that no two ever run one batch at once.

Every `every_s` each gateway reads what the others wrote (book.py's `refresh`) and renews or
tries to take the lease. The holder runs the batches: it takes up those made at any gateway,
cancels those another gateway was asked to cancel, and writes its batches' counts for the
others to show. A holder that cannot renew (Redis away, or this process stalled) stops its
runner before its hold runs out, and another takes the batches over once Redis lets the lease
go: requests it had in flight run again there, as after a restart. With Redis away no gateway
runs batches; clients may still upload, create, get, list and cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fleetgate.batches.book import BatchBook
from fleetgate.batches.runner import BatchRunner
from fleetgate.clock import Clock
from fleetgate.shared.lease import Lease

log = logging.getLogger(__name__)

EVERY_S = 1.0  # between two looks: how soon a batch made at another gateway starts


class SharedBatches:
    def __init__(
        self, book: BatchBook, runner: BatchRunner, lease: Lease, clock: Clock,
        every_s: float = EVERY_S,
    ) -> None:  # fmt: skip
        self._book = book
        self._runner = runner
        self._lease = lease
        self._clock = clock
        self._every_s = every_s
        self._task: asyncio.Task[None] | None = None

    @property
    def running_here(self) -> bool:
        return self._book.running_here

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._turns())

    async def stop(self) -> None:
        """Stop running (requests in flight run again at the next holder) and hand the lease
        on at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._book.running_here:
            await self._runner.stop()
            self._book.hand_over()
        await self._lease.release()

    async def _turns(self) -> None:
        while True:
            try:
                await self.turn()
            except Exception:  # its store's disk, or a bug: logged, and looked at again
                log.exception("batches: the shared turn failed")
            await self._clock.sleep(self._pause())

    def _pause(self) -> float:
        """Until the next look: `every_s`, or less when the hold would run out before (a
        renewal takes a budget at most)."""
        lease = self._lease
        if not lease.held():
            return self._every_s
        return max(0.0, min(self._every_s, lease.until - lease.budget_s - self._clock.now()))

    async def turn(self) -> None:
        """One look: the lease renewed (or lost, or taken), then the directory read."""
        book = self._book
        held = await self._lease.renew()
        if not held and book.running_here:
            log.warning("batches: lost the lease on the batch directory; another gateway "
                        "runs them once it lapses")  # fmt: skip
            await self._runner.stop()
            book.hand_over()
        await book.refresh()
        if held and not book.running_here:
            log.info("batches: this gateway runs the batches of its directory")
            book.take_over()
            self._runner.start()
        elif held:
            book.resume()  # those made at the other gateways since
            book.apply_cancels()
            book.save_progress()
