"""The request's way through its pool: pick, attempt, and on failure retry, hedge or continue.

    prefill (disaggregated pools)                                  upstream/prefill.py
    pick -> attempt                                                upstream/attempt.py
      failed before the client saw a byte -> retry on a backend not tried yet, after a
        backoff, while the retry budget allows                     resilience/retry.py
      a stream's first token late -> a second attempt races it     resilience/hedge.py
      a stream broke off mid-answer -> the rest from another       resilience/continuation.py
    no backend left -> the last failure, or 503 with Retry-After

Every step is reported as a lifecycle event (lifecycle/events.py), and every request that
reaches here ends with one Finished event, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

from fleetgate.clock import Clock
from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.pool import Pool
from fleetgate.lifecycle.events import (
    NO_BACKEND,
    AttemptKind,
    Finished,
    Hedged,
    Outcome,
    Retried,
    RetryRefused,
)
from fleetgate.openai_api import JSON, error_body
from fleetgate.resilience.cluster import Cluster
from fleetgate.resilience.continuation import Continuation
from fleetgate.resilience.hedge import Race
from fleetgate.resilience.retry import RETRYABLE_STATUSES, backoff_s
from fleetgate.upstream.attempt import Attempts, Broken, Exchange, Failed
from fleetgate.upstream.routed import routed

_NEVER_RETRY: frozenset[int] = frozenset()


class Failover:
    """Forwards requests to the backends of their pools, trying another when one fails before
    the first byte has gone to the client, and continuing a stream that broke off after."""

    def __init__(
        self,
        attempts: Attempts,
        continuation: Continuation,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self._attempts = attempts
        self._continuation = continuation
        self._clock = clock  # backoffs and the hedge's delay
        self._now = clock.now
        self._rng = rng

    async def forward(self, cluster: Cluster, ex: Exchange) -> None:
        """Answer the client of `ex` from the pool of `cluster`."""
        routing, emit, router, budget = ex.routing, cluster.emit, cluster.router, cluster.budget
        retries = cluster.retries
        failed: Failed | None = None
        status = 499  # nginx's "client closed request", if the client leaves first
        outcome: Outcome = "client_closed"
        try:
            if cluster.prefill is not None and routing.endpoint in ("chat", "completions"):
                ex.body = await cluster.prefill.handoff(ex)
            for attempt in range(retries.max_attempts):
                now = self._now()
                retry = bool(ex.tried)
                kind: AttemptKind = "retry" if retry else "first"
                state = routed(router, emit, request_id=ex.request_id, model=ex.model,
                               routing=routing, kind=kind, now=now, tried=ex.tried)  # fmt: skip
                if state is None:
                    break
                # A retry after a failed connect adds no work to the fleet: it is the first
                # the request puts there, so the budget does not count it.
                held = retry and not (failed is not None and failed.unsent)
                if held and not budget.try_acquire(router.pool.in_flight):
                    if emit.retry_refused is not None:
                        emit.retry_refused(RetryRefused(ex.request_id, now, ex.model))
                    break
                try:
                    if retry:
                        if emit.retried is not None:
                            before = failed.status if failed is not None else 0
                            emit.retried(Retried(ex.request_id, now, ex.model, before))
                        await self._clock.sleep(backoff_s(retries, attempt, self._rng))
                    ex.tried.append(state)
                    last = attempt + 1 == retries.max_attempts
                    retry_on = _NEVER_RETRY if last else RETRYABLE_STATUSES
                    # Not a pinned request: another backend would not hold what it continues.
                    hedge = routing.stream and cluster.hedge.enabled and routing.pinned is None
                    if not retry and hedge:
                        result = await self._hedged(cluster, ex, state, retry_on)
                    else:
                        result = await self._attempts.run(ex, state, kind, retry_on)
                finally:
                    if held:
                        budget.release()
                if result is None or isinstance(result, Broken):
                    if isinstance(result, Broken):  # the client leaving in it stays a 499
                        await self._continuation.finish(cluster, ex, result)
                    status, outcome = ex.writer.status, "answered"
                    return
                failed = result
            status, outcome = self._answer_failure(ex, failed, router.pool), "failed"
        except Exception:
            status, outcome = 500, "failed"  # the gateway's own bug: the server answers 500
            raise
        finally:
            if emit.finished is not None:
                emit.finished(finished(ex, self._now(), status, outcome))

    async def _hedged(
        self, cluster: Cluster, ex: Exchange, state: BackendState, retry_on: frozenset[int]
    ) -> Failed | Broken | None:
        """The first attempt, with a second on another backend if its first token is late
        (resilience/hedge.py); the first to produce a token keeps the client."""
        loop = asyncio.get_running_loop()
        run = self._attempts.run
        race = Race()
        first = loop.create_task(run(ex, state, "first", retry_on, race.claimer(0)))
        race.tasks.append(first)
        budget = cluster.budget
        try:
            # Shielded: a first attempt late past the delay runs on, raced by the hedge.
            with contextlib.suppress(TimeoutError):
                return await self._clock.within(asyncio.shield(first), cluster.ttft.delay_s)
            if race.winner is not None or not budget.try_acquire(cluster.pool.in_flight):
                return await first
            try:
                now = self._now()
                emit = cluster.emit
                other = routed(
                    cluster.router, emit, request_id=ex.request_id, model=ex.model,
                    routing=ex.routing, kind="hedge", now=now, tried=ex.tried,
                )  # fmt: skip
                if other is None:
                    return await first
                ex.tried.append(other)
                if emit.hedged is not None:
                    emit.hedged(Hedged(ex.request_id, now, ex.model, other.backend.id))
                second = loop.create_task(run(ex, other, "hedge", retry_on, race.claimer(1)))
                race.tasks.append(second)
                return await _first_answer({first, second})
            finally:
                budget.release()
        finally:
            for task in race.tasks:
                task.cancel()
            # Until both have ended (and said so), the request is not over: its Finished
            # comes after every attempt's AttemptEnded.
            await asyncio.wait(race.tasks)

    def _answer_failure(self, ex: Exchange, failed: Failed | None, pool: Pool) -> int:
        """Send the client the last failure, or a 503 when no backend could be tried."""
        if failed is None:
            ex.backend = NO_BACKEND
            body = _nothing_to_try(ex, pool)
            failed = Failed(503, body, [(b"content-type", JSON), (b"retry-after", b"1")])
        ex.writer.send(
            failed.status, [*failed.headers, (b"x-request-id", ex.request_id)], failed.body
        )
        return failed.status


def _nothing_to_try(ex: Exchange, pool: Pool) -> bytes:
    """Why no backend could be tried: none healthy, or (a residency's refusal) none in the
    tenant's regions while the pool has candidates elsewhere."""
    model, regions = ex.routing.model, ex.routing.regions
    if regions is None or not pool.candidates:
        return error_body(503, f"No healthy backend serves {model!r} right now; retry shortly.")
    message = (
        f"No healthy backend of {model!r} in the regions {ex.tenant!r}'s requests may be served "
        f"in ({', '.join(sorted(regions))}) can take it right now; it was not sent to another "
        "region (tenants[].regions). Retry shortly."
    )
    return error_body(503, message, None, "region_unavailable")


def finished(ex: Exchange, at: float, status: int, outcome: Outcome) -> Finished:
    """The Finished event of a request that reached its pool, as `ex` says it went."""
    progress = ex.progress
    prompt: int | None = None
    completion, cost = 0, 0.0
    used = ex.used()
    if used is not None and (used[0] or used[1]):  # what its tenant is charged
        prompt, completion = used
        if ex.price is not None:
            cost = ex.price(prompt, completion)
    return Finished(
        request_id=ex.request_id,
        at=at,
        model=ex.model,
        started=ex.started,
        status=status,
        backend=ex.backend,
        outcome=outcome,
        ttft_s=ex.ttft_s,
        output_tokens=progress.tokens if progress is not None else None,
        tenant=ex.tenant,
        priority=ex.priority_label,
        queued_s=ex.queued_s,
        attempts=ex.attempts,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost_usd=cost,
        cache=ex.cache,
    )


async def _first_answer(
    tasks: set[asyncio.Task[Failed | Broken | None]],
) -> Failed | Broken | None:
    """As soon as one attempt has answered the client (None, or a stream that then broke);
    else the last failure."""
    failed: Failed | Broken | None = None
    pending = tasks
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task.cancelled():
                continue  # lost the race: the winner cancelled it
            result = task.result()
            if not isinstance(result, Failed):
                return result
            failed = result
    return failed
