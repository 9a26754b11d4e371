"""Which gateway runs the batches of a directory that several share: the one holding the
directory's lease in Redis (shared/lease.py), so that no two ever run one batch at once.

Every `every_s` each gateway reads what the others wrote (book.py's `refresh`) and, on a task
of its own, renews or tries to take the lease. The holder runs the batches: it takes up those
made at any gateway, cancels those another gateway was asked to cancel, and writes its
batches' counts for the others to show. A holder that cannot renew (Redis away, or slow)
stops its runner before its hold runs out (shared/lease.py: the hold is given up as soon as a
renewal could no longer land in time), and another takes the batches over once Redis lets the
lease go: requests it had in flight run again there, as after a restart. With Redis away no
gateway runs batches; clients may still upload, create, get, list and cancel.
"""

from __future__ import annotations

import asyncio
import logging

from fleetgate.batches.book import BatchBook
from fleetgate.batches.runner import BatchRunner
from fleetgate.clock import Clock
from fleetgate.shared.lease import Lease

log = logging.getLogger(__name__)

EVERY_S = 1.0  # between two looks: how soon a batch made at another gateway starts


class SharedBatches:
    """Runs a shared directory's batches while this gateway holds its lease (module
    docstring): two tasks, one renewing the lease (and stopping the runner the moment it
    cannot count on it), one looking at the directory, so that a slow disk never delays a
    renewal."""

    def __init__(
        self, book: BatchBook, runner: BatchRunner, lease: Lease, clock: Clock,
        every_s: float = EVERY_S,
    ) -> None:  # fmt: skip
        self._book = book
        self._runner = runner
        self._lease = lease
        self._clock = clock
        self._every_s = every_s
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def running_here(self) -> bool:
        return self._book.running_here

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._renewals()), loop.create_task(self._looks())]

    async def stop(self) -> None:
        """Stop running (requests in flight run again at the next holder) and hand the lease
        on at once."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)  # a cancel of this stop itself is not swallowed
        self._tasks = []
        await self._give_up()
        await self._lease.release()

    async def _renewals(self) -> None:
        lease = self._lease
        while True:
            await self.renew()
            pause = self._every_s
            if lease.held():  # renewed again before the hold runs out (a budget at most)
                pause = min(pause, lease.until - lease.budget_s - self._clock.now())
            await self._clock.sleep(max(0.0, pause))

    async def _looks(self) -> None:
        while True:
            await self._clock.sleep(self._every_s)
            try:
                await self.look()
            except Exception:  # its store's disk, or a bug: logged, and looked at again
                log.exception("batches: looking at the shared batch directory failed")

    async def renew(self) -> None:
        """The lease renewed, taken or lost, and the runner started or stopped to match."""
        held = await self._lease.renew()
        book = self._book
        if held and not book.running_here:
            await book.refresh()
            log.info("batches: this gateway runs the batches of its directory")
            book.take_over()
            self._runner.start()
            self._apply()
        elif not held and book.running_here:
            log.warning("batches: lost the lease on the batch directory; another gateway "
                        "runs them once it lapses")  # fmt: skip
            await self._give_up()

    async def look(self) -> None:
        """What the other gateways wrote, read; and, while running here, acted on and what
        the runner wrote since the last look told."""
        await self._book.refresh()
        if self._book.running_here:
            self._apply()
        await self._book.tell()

    def _apply(self) -> None:
        book = self._book
        book.resume()  # those made at the other gateways since
        book.apply_cancels()
        book.save_progress()

    async def _give_up(self) -> None:
        if self._book.running_here:
            await self._runner.stop()
            self._book.hand_over()
