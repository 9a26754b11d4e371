"""Dynamic batching, as Triton's dynamic batcher does it: the items of many requests (one per
input text) wait in one queue and run through the model together, one batch at a time.

When the model is free and items wait, `plan_batch` says how many go:
    max_batch_size waiting                    -> max_batch_size, at once
    else a preferred size can be formed       -> the largest preferred size <= waiting, at once
    else the oldest waited max_queue_delay    -> all that wait
    else                                      -> none yet: wait until the oldest has waited it
So the batch size follows the load: with the default delay of 0, a lone request on an idle
model runs at once (a batch of 1, the lowest latency), while under load the items that arrive
during a batch wait for it to end and the next batch takes them all, up to the maximum (the
highest throughput). A delay above 0 makes items wait for company even on an idle model.

Which items: the highest priority first (the lowest number, as vLLM orders `priority`), then
the oldest. An item still waiting at its request's deadline (`queue_timeout_ms`, or less if
the request asks) fails its whole request; a request whose items would take the queue past
`max_queue_items` is refused at once. Both are `Overloaded`, with a Retry-After from the rate
the model drains the queue at.

Time (a clock and a sleep) and the model (`run_batch`) are given, so tests drive it exactly.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, TypeVar, cast

from fleetgate.settings import Settings, at_least, positive

T = TypeVar("T")
R = TypeVar("R")


class BatchingSettings(Settings, frozen=True):
    """The dynamic batcher's knobs (Triton's names, in milliseconds rather than microseconds)."""

    max_batch_size: int = 32  # items per model run at most (MiniLM on a CPU gains little above)
    # Sizes worth running at once when that many wait (Triton's preferred_batch_size); none:
    # only max_batch_size is, as in Triton when none is given.
    preferred_batch_sizes: tuple[int, ...] = ()
    # How long the oldest item may wait for a preferred size to form; 0 (Triton's default):
    # never wait for company, so an idle model answers a lone request at once.
    max_queue_delay_ms: float = 0.0
    queue_timeout_ms: float = 30_000.0  # an item still waiting this long fails its request
    max_queue_items: int = 1024  # items waiting at most; a request that would pass it is refused

    def __post_init__(self) -> None:
        at_least("max_batch_size", self.max_batch_size, 1)
        for size in self.preferred_batch_sizes:
            if not 1 <= size <= self.max_batch_size:
                raise ValueError(
                    f"`preferred_batch_sizes` must lie in [1, max_batch_size], got {size}"
                )
        if list(self.preferred_batch_sizes) != sorted(set(self.preferred_batch_sizes)):
            raise ValueError("`preferred_batch_sizes` must be increasing, without repeats")
        at_least("max_queue_delay_ms", self.max_queue_delay_ms, 0)
        positive("queue_timeout_ms", self.queue_timeout_ms)
        at_least("max_queue_items", self.max_queue_items, 1)


def plan_batch(settings: BatchingSettings, waiting: int, waited_s: float) -> int:
    """How many of `waiting` items to run now, the oldest having waited `waited_s`; 0: none
    yet (see the module's docstring)."""
    if waiting >= settings.max_batch_size:
        return settings.max_batch_size
    for size in reversed(settings.preferred_batch_sizes):
        if size <= waiting:
            return size
    if waited_s * 1000.0 >= settings.max_queue_delay_ms:
        return waiting
    return 0


class Overloaded(Exception):
    """The request is not served: 503 with Retry-After. `code`: queue_full or queue_timeout."""

    def __init__(self, message: str, code: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.message, self.code, self.retry_after_s = message, code, retry_after_s


@dataclass(frozen=True, slots=True)
class BatchRun:
    """One batch through the model: its items, its requests, how long it took, and for each
    request it finished, how long that request's last item waited in the queue."""

    items: int
    requests: int
    seconds: float
    queue_waits_s: tuple[float, ...]


@dataclass(slots=True, eq=False)
class _Request(Generic[R]):
    future: asyncio.Future[list[R]]
    results: list[R | None]
    arrival: float
    deadline: float
    queued: int  # its items still waiting
    left: int  # its results still to come
    waited_s: float = 0.0  # until its last item was taken into a batch


@dataclass(slots=True, eq=False)
class _Item(Generic[T, R]):
    request: _Request[R]
    index: int
    payload: T = field(repr=False)


class Batcher(Generic[T, R]):
    """The queue of items and the loop that runs them through `run_batch` (module docstring).

    `run_batch` gets the batch's payloads and returns a result for each, in order."""

    def __init__(
        self,
        settings: BatchingSettings,
        run_batch: Callable[[list[T]], Awaitable[Sequence[R]]],
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_batch: Callable[[BatchRun], None] | None = None,
    ) -> None:
        self.settings = settings
        self._run_batch = run_batch
        self._clock = clock
        self._sleep = sleep
        self._on_batch = on_batch
        self._items: list[tuple[int, int, _Item[T, R]]] = []  # (priority, seq, item): a heap
        self._arrivals: deque[_Request[R]] = deque()  # oldest first: whose wait counts
        self._deadlines: list[tuple[float, int, _Request[R]]] = []  # a heap
        self._seq = itertools.count()
        self.waiting_items = 0
        self.waiting_requests = 0
        self.running_items = 0
        self.running_requests = 0
        self._done_items = 0
        self._busy_s = 0.0
        self._changed = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._batch_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._serve())

    async def stop(self) -> None:
        for task in (self._loop_task, self._batch_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def submit(
        self, payloads: Sequence[T], priority: int, timeout_s: float | None = None
    ) -> asyncio.Future[list[R]]:
        """Queue one request's items; its future gets their results in order. `timeout_s`
        shortens the queue timeout (never lengthens it). Overloaded if the queue is full."""
        n = len(payloads)
        if not n:
            raise ValueError("a request has at least one item")
        if self.waiting_items + n > self.settings.max_queue_items:
            raise Overloaded(
                f"The queue holds {self.waiting_items} inputs and takes at most "
                f"{self.settings.max_queue_items}; retry shortly.",
                "queue_full", self.retry_after_s(),
            )  # fmt: skip
        now = self._clock()
        limit_s = self.settings.queue_timeout_ms / 1000.0
        if timeout_s is not None:
            limit_s = min(limit_s, timeout_s)
        future: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        results: list[R | None] = [None] * n
        request = _Request(future, results, now, now + limit_s, n, n)
        for i, payload in enumerate(payloads):
            heapq.heappush(self._items, (priority, next(self._seq), _Item(request, i, payload)))
        self._arrivals.append(request)
        heapq.heappush(self._deadlines, (request.deadline, next(self._seq), request))
        self.waiting_items += n
        self.waiting_requests += 1
        future.add_done_callback(partial(self._settled, request))
        self._changed.set()
        return future

    def retry_after_s(self) -> float:
        """How long the queue takes to drain at the model's measured rate (1 s before any)."""
        if not self._done_items:
            return 1.0
        return max(1.0, math.ceil(self.waiting_items * self._busy_s / self._done_items))

    def _settled(self, request: _Request[R], _: asyncio.Future[list[R]]) -> None:
        """Answered, failed or given up by its client: its waiting items leave the count (the
        heap drops them when they come up)."""
        if request.queued:
            self.waiting_items -= request.queued
            self.waiting_requests -= 1
            request.queued = 0
            self._changed.set()
            if len(self._items) > 2 * self.waiting_items + self.settings.max_batch_size:
                self._compact()

    def _compact(self) -> None:
        """Drop the items of settled requests that the heap still holds (it drops them only
        as they come up, and a low priority's may never): `max_queue_items` bounds the heap."""
        self._items = [entry for entry in self._items if not entry[2].request.future.done()]
        heapq.heapify(self._items)
        self._deadlines = [entry for entry in self._deadlines if entry[2].queued]
        heapq.heapify(self._deadlines)

    async def _serve(self) -> None:
        while True:
            self._changed.clear()
            now = self._clock()
            self._expire(now)
            wake_at = self._next_deadline()
            if self._batch_task is None and self.waiting_items:
                oldest = self._oldest()
                size = plan_batch(self.settings, self.waiting_items, now - oldest.arrival)
                if size:
                    self._start(self._take(size, now))
                    continue
                ready_at = oldest.arrival + self.settings.max_queue_delay_ms / 1000.0
                wake_at = ready_at if wake_at is None else min(wake_at, ready_at)
            await self._wait(None if wake_at is None else wake_at - now)

    async def _wait(self, seconds: float | None) -> None:
        """Until something changes (a request, a settled one, a batch's end) or `seconds`."""
        changed = asyncio.ensure_future(self._changed.wait())
        if seconds is None:
            await changed
            return
        timer = asyncio.ensure_future(self._sleep(max(seconds, 0.0)))
        try:
            await asyncio.wait((changed, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            timer.cancel()

    def _oldest(self) -> _Request[R]:
        arrivals = self._arrivals
        while not arrivals[0].queued:
            arrivals.popleft()
        return arrivals[0]

    def _next_deadline(self) -> float | None:
        deadlines = self._deadlines
        while deadlines and not deadlines[0][2].queued:
            heapq.heappop(deadlines)
        return deadlines[0][0] if deadlines else None

    def _expire(self, now: float) -> None:
        while (deadline := self._next_deadline()) is not None and deadline <= now:
            request = heapq.heappop(self._deadlines)[2]
            limit_ms = (request.deadline - request.arrival) * 1000.0
            request.future.set_exception(
                Overloaded(
                    f"The request waited its limit of {limit_ms:.0f} ms in the queue; the "
                    "server is busy, retry shortly.",
                    "queue_timeout", self.retry_after_s(),
                )
            )  # fmt: skip
            self._settled(request, request.future)

    def _take(self, size: int, now: float) -> list[_Item[T, R]]:
        batch: list[_Item[T, R]] = []
        while len(batch) < size:
            item = heapq.heappop(self._items)[2]
            request = item.request
            if request.future.done():
                continue  # it failed or its client left: already out of the counts
            batch.append(item)
            request.queued -= 1
            self.waiting_items -= 1
            if not request.queued:
                self.waiting_requests -= 1
                request.waited_s = now - request.arrival
        return batch

    def _start(self, batch: list[_Item[T, R]]) -> None:
        self.running_items = len(batch)
        self.running_requests = len({id(item.request) for item in batch})
        self._batch_task = asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[_Item[T, R]]) -> None:
        started = self._clock()
        try:
            results = await self._run_batch([item.payload for item in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} results for a batch of {len(batch)}")
        except Exception as exc:
            for item in batch:
                if not item.request.future.done():
                    item.request.future.set_exception(exc)
            results = ()
        seconds = self._clock() - started
        finished: list[float] = []
        for item, result in zip(batch, results, strict=False):
            request = item.request
            if request.future.done():
                continue
            request.results[item.index] = result
            request.left -= 1
            if not request.left:
                request.future.set_result(cast("list[R]", request.results))
                finished.append(request.waited_s)
        self._done_items += len(batch)
        self._busy_s += seconds
        self.running_items = self.running_requests = 0
        self._batch_task = None
        self._changed.set()
        if self._on_batch is not None:
            self._on_batch(BatchRun(len(batch), len({id(i.request) for i in batch}), seconds,
                                    tuple(finished)))  # fmt: skip
