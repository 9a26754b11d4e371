"""The batch runner: `concurrency` workers that take requests from the book (book.py) and run
each through the gateway's own request path, in this process, as the batch's tenant and on the
batch lane (`Serve`: gateway/inference.py's `InferenceEndpoints.serve_as`, which parses it and
hands it to the Director). So a batch meets the same limits, admission (interactive traffic
first), routing, retries and metrics as a client's request.

A 429 or 503 (a rate limit or budget, a full pool, no backend) is not a request's answer: it
goes back to its batch, which starts nothing for its Retry-After (1 to 60 s, jittered), and the
worker moves on to other batches' requests; so one tenant over its budget, or one model with no
backend, never holds the workers. A request cut off by the gateway stopping has no line, and
runs again after the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable

from fleetgate.batches.book import BatchBook
from fleetgate.batches.running import Run
from fleetgate.batches.validation import BatchRequest
from fleetgate.clock import Clock
from fleetgate.lifecycle.downstream import Downstream, Sink
from fleetgate.traffic.door import Caller

log = logging.getLogger(__name__)

# Runs a request body as a POST to a path for a caller, its answer written to the writer.
Serve = Callable[[Caller, bytes, bytes, Downstream], Awaitable[None]]
RETRY_STATUSES = (429, 503)
MAX_WAIT_S = 60.0
TICK_S = 5.0  # between two looks for expired batches and those past their retention


class BatchRunner:
    def __init__(
        self,
        book: BatchBook,
        serve: Serve,
        concurrency: int,
        rng: random.Random,
        clock: Clock,
    ) -> None:
        self._book = book
        self._serve = serve
        self._concurrency = concurrency
        self._rng = rng
        self._clock = clock
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the workers (and the ticks); batches resumed or created are taken up."""
        self._book.on_work = self._wake.set
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._work()) for _ in range(self._concurrency)]
        self._tasks.append(loop.create_task(self._ticks()))
        self._wake.set()

    async def stop(self) -> None:
        """Stop at once: requests in flight are dropped (and run again after a restart)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _work(self) -> None:
        book = self._book
        while True:
            job = book.take()
            if job is None:
                await self._idle()
                continue
            run, request = job
            try:
                await self._run(run, request)
            except Exception:  # a fault of the book's (it logs its store's): the worker goes on
                log.exception("batch %s: request %r lost", run.stored.batch.id, request.custom_id)

    async def _idle(self) -> None:
        """Wait for new work, or for the first deferred request's time."""
        self._wake.clear()
        ready_at = self._book.ready_at()
        if ready_at is None:
            await self._wake.wait()
            return
        with contextlib.suppress(TimeoutError):
            await self._clock.within(self._wake.wait(), max(0.0, ready_at - self._book.now()))

    async def _run(self, run: Run, request: BatchRequest) -> None:
        book = self._book
        caller = book.caller(run)
        if caller is None:
            owner = run.stored.owner
            message = (
                f"The batch's tenant {owner!r}, or the API key that created the batch, is no "
                "longer in the gateway's config."
            )
            book.fail(run, request, "tenant_not_found", message)
            return
        answer = Sink()
        try:
            await self._serve(caller, run.path, request.body, answer)
        except Exception:  # the gateway's own fault: the request's line says so
            log.exception("batch %s: request %r failed", run.stored.batch.id, request.custom_id)
            book.fail(run, request, "gateway_error", "The gateway failed running it.")
            return
        if answer.status in RETRY_STATUSES:
            book.defer(run, request, book.now() + self._wait(answer))
            return
        request_id = (answer.header(b"x-request-id") or b"").decode("latin-1")
        book.record(run, request, answer.status or 500, request_id, answer.body)

    def _wait(self, answer: Sink) -> float:
        """The seconds the answer asked to wait (1 to 60), jittered up to 20 % longer so
        that what waited together does not come back together."""
        try:
            asked = float(answer.header(b"retry-after") or 1)
        except ValueError:
            asked = 1.0
        return min(MAX_WAIT_S, max(1.0, asked)) * self._rng.uniform(1.0, 1.2)

    async def _ticks(self) -> None:
        while True:
            await self._clock.sleep(TICK_S)
            try:
                self._book.tick()
            except Exception:
                log.exception("batches: the periodic check failed")
