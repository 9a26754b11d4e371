"""Batches from creation to their end: the state machine, driven by the injected wall clock.

    validating -> in_progress -> finalizing -> completed
    validating -> failed                 the input file has errors (`errors`, line by line)
    in_progress -> cancelling -> cancelled    no request starts; those in flight end first
    in_progress -> expired               past its 24 h window; what never ran is written to
                                         the error file with code `batch_expired`

The runner (runner.py) takes requests with `take` and hands each back with `record`, `fail` or
`defer` (a 429 or 503: back at the front of its batch, which starts nothing before the time
given). `take` goes round robin across tenants, then across each tenant's batches, so neither a
tenant with many batches nor one whose requests wait can hold every worker. A result is
appended to the output file (2xx) or the error file (anything else) as it comes; a batch's
object is written at each change of status. `resume` picks up, after a restart, every batch
still running: requests with a line in either file are not run again.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import msgspec

from fleetgate.batches.objects import (
    ACTIVE,
    Batch,
    BatchError,
    BatchUsage,
    Errors,
    FileObject,
    RequestCounts,
    Status,
    StoredBatch,
)
from fleetgate.batches.results import answer_line, error_line, read_back, tokens
from fleetgate.batches.settings import BatchesSettings
from fleetgate.batches.store import BatchStore, valid_id
from fleetgate.batches.validation import ENDPOINTS, BatchRequest, check_input, check_metadata
from fleetgate.traffic.door import Caller, Refused
from fleetgate.traffic.tenants import Tenant

log = logging.getLogger(__name__)

WINDOW_S = 86400  # "24h", the only completion window
STORE_RETRY_S = 30.0  # a request whose line could not be written runs again this much later


@dataclass(eq=False, slots=True)
class Run:
    """A batch being run: what is left to start, in flight, and what came back."""

    stored: StoredBatch
    pending: deque[BatchRequest]
    seq: int = 0  # its place in the round robin among its tenant's batches
    not_before: float = 0.0  # wall time before which none of its requests starts (`defer`)
    in_flight: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    ending: Status | None = None  # how it ends, once decided: a retry ends it the same way

    @property
    def path(self) -> bytes:
        return self.stored.batch.endpoint.encode()


class BatchBook:
    """Every batch of the store, and the requests of those running (module docstring)."""

    def __init__(
        self,
        store: BatchStore,
        settings: BatchesSettings,
        tenants: Mapping[str, Tenant],
        wall_clock: Callable[[], float],
        keys: frozenset[tuple[str, str]] | None = None,
    ) -> None:
        self._store = store
        self._settings = settings
        self._tenants = tenants  # the config's: a batch runs as its tenant as configured now
        self._keys = keys  # (tenant, key id) of the keys configured now; None: auth off
        self._clock = wall_clock
        self._runs: dict[str, Run] = {}  # the batches running, oldest first
        self._seq = 0  # the last Run.seq given
        self._last_tenant = ""  # the round robin's last turns: the tenant's name...
        self._last_run: dict[str, int] = {}  # ...and, for each tenant, its batch's seq
        self.on_work: Callable[[], None] = lambda: None  # requests to take: the runner's wake

    def resume(self) -> None:
        """Pick up the batches a previous run of the gateway left running."""
        active = [s for s in self._store.batches.values() if s.batch.status in ACTIVE]
        for stored in sorted(active, key=lambda s: s.batch.created_at):
            try:
                self._reopen(stored)
            except Exception:  # its files cannot be read or written: the others go on
                log.exception("batches: cannot resume batch %s; it fails", stored.batch.id)
                self._runs.pop(stored.batch.id, None)
                self._unresumable(stored)
        if self._runs:
            self.on_work()

    def _unresumable(self, stored: StoredBatch) -> None:
        """Failed, not left running on disk where nothing would ever run, expire or delete
        it (and it would count towards its tenant's batches)."""
        message = "The batch could not be resumed after a restart; create it again."
        try:
            self._fail(Run(stored, deque()), [BatchError(code="resume_failed", message=message)])
        except Exception:
            log.exception("batches: cannot mark batch %s failed", stored.batch.id)

    def _reopen(self, stored: StoredBatch) -> None:
        batch = stored.batch
        try:
            data = self._store.input_of(batch.id)
        except OSError:
            data = b""
        # Checked as it was at creation: a lower `max_requests` since then does not fail it.
        most = max(self._settings.max_requests, batch.request_counts.total)
        checked = check_input(data, batch.endpoint, most)
        run = self._add(Run(stored, deque()))
        answered = read_back(self._store.lines(stored.output_id))
        failed = read_back(self._store.lines(stored.error_id))
        run.completed, run.failed = answered.lines, failed.lines
        run.input_tokens, run.output_tokens = answered.input_tokens, answered.output_tokens
        done = answered.custom_ids | failed.custom_ids
        if checked.errors and not done:  # its requests are gone (the store was tampered with)
            message = "The batch's requests could not be read back after a restart."
            checked.errors = [BatchError(code="input_lost", message=message)]
            self._fail(run, checked.errors)
            return
        run.pending.extend(r for r in checked.requests if r.custom_id not in done)
        if batch.status == "validating":  # created just before a crash
            self._change(run, "in_progress")
        self._settle(run)

    # What clients ask.

    def create(
        self,
        caller: Caller,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str] | None,
    ) -> Batch:
        """A new batch, checked and started (or failed, with its input file's errors);
        `Refused` (400) for what the request itself gets wrong."""
        owner = caller.tenant.name
        if endpoint not in ENDPOINTS:
            raise Refused(
                400, f"`endpoint` must be one of {', '.join(ENDPOINTS)}, not {endpoint[:100]!r}.",
                "invalid_value", param="endpoint",
            )  # fmt: skip
        if completion_window != "24h":
            message = f"`completion_window` must be 24h, not {completion_window[:20]!r}."
            raise Refused(400, message, "invalid_value", param="completion_window")
        check_metadata(metadata)
        file = self._store.files.get(input_file_id) if valid_id(input_file_id) else None
        if file is None or file.owner != owner:
            raise Refused(
                400, f"No file {input_file_id[:80]!r} here: upload it first (POST /v1/files, "
                "purpose `batch`).", "invalid_value", param="input_file_id",
            )  # fmt: skip
        if file.file.purpose != "batch":
            message = "The input file must be one uploaded with purpose `batch`."
            raise Refused(400, message, "invalid_value", param="input_file_id")
        kept = sum(1 for s in self._store.batches.values() if s.owner == owner)
        if kept >= self._settings.max_batches_per_tenant:
            raise Refused(
                400, f"You keep {kept} batches, the most allowed here "
                "(`batches.max_batches_per_tenant`); they go `batches.retention_s` after they "
                "end.", "too_many_batches",
            )  # fmt: skip
        self._check_running(owner)
        now = int(self._clock())
        store = self._store
        batch = Batch(
            id=store.new_id("batch_"), endpoint=endpoint, input_file_id=input_file_id,
            completion_window=completion_window, status="validating", created_at=now,
            expires_at=now + WINDOW_S, metadata=metadata,
        )  # fmt: skip
        stored = StoredBatch(
            batch=batch, owner=owner, key_id=caller.key_id, output_id=store.new_id("file-"),
            error_id=store.new_id("file-"),
        )  # fmt: skip
        try:
            data = store.content(input_file_id)
        except OSError:
            message = "The input file's content is gone; upload it again."
            raise Refused(400, message, "invalid_value", param="input_file_id") from None
        checked = check_input(data, endpoint, self._settings.max_requests)
        run = Run(stored, deque(checked.requests))
        if checked.errors:
            self._fail(run, checked.errors)
            return batch
        batch.request_counts.total = len(checked.requests)
        batch.model = checked.model
        store.keep_input(batch.id, input_file_id)
        self._add(run)
        self._change(run, "in_progress")
        self.on_work()
        return self.view(stored)

    def _check_running(self, owner: str) -> None:
        """`Refused` (429) over the caps on batches running, which bound their memory."""
        settings = self._settings
        mine = sum(1 for r in self._runs.values() if r.stored.owner == owner)
        if mine >= settings.max_running_batches_per_tenant:
            raise Refused(
                429, f"You have {mine} batches running, the most allowed here "
                "(`batches.max_running_batches_per_tenant`); create this one once one of them "
                "has ended, or put more requests in one batch.", "too_many_running_batches",
            )  # fmt: skip
        if len(self._runs) >= settings.max_running_batches:
            raise Refused(
                429, "The gateway runs as many batches as it may "
                "(`batches.max_running_batches`); create this one later.",
                "too_many_running_batches",
            )  # fmt: skip

    def get(self, owner: str, batch_id: str) -> Batch:
        return self.view(self._owned(owner, batch_id))

    def cancel(self, owner: str, batch_id: str) -> Batch:
        """Stop starting the batch's requests; it is cancelled once those in flight end."""
        stored = self._owned(owner, batch_id)
        status = stored.batch.status
        if status not in ("in_progress", "cancelling", "cancelled"):
            raise Refused(
                409, f"The batch is {status}: only one in progress can be cancelled.",
                "batch_not_cancellable",
            )  # fmt: skip
        run = self._runs.get(batch_id)
        if status == "in_progress" and run is not None:
            self._change(run, "cancelling")
            self._settle(run)
        return self.view(stored)

    def listing(self, owner: str, limit: int, after: str | None) -> tuple[list[Batch], bool]:
        """The owner's batches, newest first, from the one after `after`; and whether more
        follow."""
        mine = [s for s in self._store.batches.values() if s.owner == owner]
        mine.sort(key=lambda s: (s.batch.created_at, s.batch.id), reverse=True)
        if after is not None:
            ids = [s.batch.id for s in mine]
            mine = mine[ids.index(after) + 1 :] if after in ids else []
        return [self.view(s) for s in mine[:limit]], len(mine) > limit

    def view(self, stored: StoredBatch) -> Batch:
        """The batch as a client sees it: with a running batch's counts of the moment."""
        run = self._runs.get(stored.batch.id)
        if run is None:
            return stored.batch
        return msgspec.structs.replace(stored.batch, request_counts=_counts(run), usage=_usage(run))

    def _owned(self, owner: str, batch_id: str) -> StoredBatch:
        stored = self._store.batches.get(batch_id) if valid_id(batch_id) else None
        if stored is None or stored.owner != owner:  # another's is not found either
            raise Refused(404, f"No such batch: {batch_id[:80]!r}.", "not_found")
        return stored

    # What the runner asks.

    def take(self) -> tuple[Run, BatchRequest] | None:
        """The next request to start: the tenants (by name) take turns, and within a tenant
        its batches (oldest first); None when none is ready to start."""
        now = self._clock()
        ready: dict[str, list[Run]] = {}
        for run in self._runs.values():
            if run.pending and run.not_before <= now and self._running(run, now):
                ready.setdefault(run.stored.owner, []).append(run)
        if not ready:
            return None
        # The first after the last turn's, else the first: fair while batches come and go.
        owners = sorted(ready)
        owner = next((o for o in owners if o > self._last_tenant), owners[0])
        runs = ready[owner]  # by seq: `_runs` keeps the order they were added in
        last = self._last_run.get(owner, 0)
        run = next((r for r in runs if r.seq > last), runs[0])
        self._last_tenant, self._last_run[owner] = owner, run.seq
        run.in_flight += 1
        return run, run.pending.popleft()

    def ready_at(self) -> float | None:
        """The wall time the first deferred request may start; None when none waits."""
        now = self._clock()
        waiting = [r.not_before for r in self._runs.values() if r.pending and self._running(r, now)]
        return min(waiting, default=None)

    def now(self) -> float:
        """The book's wall clock: what `defer`'s times are measured on."""
        return self._clock()

    def running(self, run: Run) -> bool:
        """Whether the batch may still start requests (not cancelled, nor past its window)."""
        return self._running(run, self._clock())

    def caller(self, run: Run) -> Caller | None:
        """Whose requests these are, from the config as it is now; None when its tenant is
        no longer there or, with auth on, neither is the key that made it."""
        stored = run.stored
        tenant = self._tenants.get(stored.owner)
        if tenant is None or (
            self._keys is not None and (stored.owner, stored.key_id) not in self._keys
        ):  # with auth on, a batch made with auth off (anonymous's), or with a removed key
            return None
        return Caller(tenant, stored.key_id)

    def record(
        self, run: Run, request: BatchRequest, status: int, request_id: str, body: bytes
    ) -> None:
        """A request's answer: to the output file when 2xx, else to the error file."""
        good = 200 <= status < 300
        line_id = self._store.random_id("batch_req_")
        line = answer_line(line_id, request.custom_id, status, request_id, body)
        run.in_flight -= 1
        if self._written(run, request, line, good) and good:
            prompt, completion = tokens(body)
            run.input_tokens += prompt
            run.output_tokens += completion
        self._settle(run)

    def fail(self, run: Run, request: BatchRequest, code: str, message: str) -> None:
        """A request the gateway could not run at all."""
        run.in_flight -= 1
        self._written(run, request, self._error_line(request, code, message), False)
        self._settle(run)

    def defer(self, run: Run, request: BatchRequest, not_before: float) -> None:
        """A request turned away for now (429, 503): it goes first again, and its batch starts
        nothing before `not_before` (a rate limit or a missing backend is the batch's, not
        one request's)."""
        run.in_flight -= 1
        run.pending.appendleft(request)
        run.not_before = max(run.not_before, not_before)
        self._settle(run)

    def tick(self) -> None:
        """End what has ended (a window passed with nothing in flight), and delete the
        batches and files past their retention."""
        for run in list(self._runs.values()):
            self._settle(run)  # each on its own: one that fails stops none of the others
        now = self._clock()
        retention = self._settings.retention_s
        for stored in list(self._store.batches.values()):
            ended = stored.ended_at
            if ended is not None and ended + retention <= now:
                _logged(self._store.delete_batch, stored.batch.id)
        for file in list(self._store.files.values()):
            expires = file.file.expires_at
            if expires is not None and expires <= now:
                _logged(self._store.delete_file, file.file.id)

    # The state machine.

    def _add(self, run: Run) -> Run:
        self._seq += 1
        run.seq = self._seq
        self._runs[run.stored.batch.id] = run
        return run

    def _running(self, run: Run, now: float) -> bool:
        batch = run.stored.batch
        return batch.status == "in_progress" and now < (batch.expires_at or now + 1)

    def _settle(self, run: Run) -> None:
        """Move the batch on if nothing of it is in flight and it is done, cancelled or past
        its window. What its store cannot write now (a full disk) is logged, and the next
        `tick` tries again."""
        try:
            self._move_on(run)
        except Exception:
            log.exception("batches: cannot end batch %s now; tried again", run.stored.batch.id)

    def _move_on(self, run: Run) -> None:
        if run.in_flight:
            return
        status = run.stored.batch.status
        if run.ending is not None:
            self._end(run, run.ending)
        elif status == "cancelling":
            self._end(run, "cancelled")
        elif status == "finalizing" or (status == "in_progress" and not run.pending):
            self._end(run, "completed")
        elif status == "in_progress" and not self._running(run, self._clock()):
            message = "The batch's 24h completion window ended before this request ran."
            lines = [self._error_line(r, "batch_expired", message) for r in run.pending]
            self._store.append(run.stored.error_id, *lines)  # one write for up to 50k lines
            run.failed += len(lines)
            run.pending.clear()
            self._end(run, "expired")

    def _end(self, run: Run, status: Status) -> None:
        run.ending = status
        stored, batch = run.stored, run.stored.batch
        batch.request_counts, batch.usage = _counts(run), _usage(run)
        if status == "completed" and batch.finalizing_at is None:
            self._change(run, "finalizing")
        now = int(self._clock())
        for file_id, count, kind in ((stored.output_id, run.completed, "output"),
                                     (stored.error_id, run.failed, "error")):  # fmt: skip
            if not count:
                continue
            self._store.sync(file_id)  # a power cut cannot keep `completed` and lose lines
            file = FileObject(
                id=file_id, bytes=self._store.size(file_id), created_at=now,
                filename=f"{batch.id}_{kind}.jsonl", purpose="batch_output",
                expires_at=now + int(self._settings.retention_s),
            )  # fmt: skip
            self._store.publish(file, stored.owner)
            if kind == "output":
                batch.output_file_id = file_id
            else:
                batch.error_file_id = file_id
        self._change(run, status)
        del self._runs[batch.id]
        _logged(self._store.delete_input, batch.id)

    def _fail(self, run: Run, errors: list[BatchError]) -> None:
        batch = run.stored.batch
        batch.errors = Errors(data=errors)
        self._runs.pop(batch.id, None)
        self._change(run, "failed")
        _logged(self._store.delete_input, batch.id)

    def _change(self, run: Run, status: Status) -> None:
        """The batch's new status and its time, written at once."""
        batch = run.stored.batch
        now = int(self._clock())
        batch.status = status
        if status == "in_progress":
            batch.in_progress_at = now
        elif status == "finalizing":
            batch.finalizing_at = now
        elif status == "completed":
            batch.completed_at = now
        elif status == "failed":
            batch.failed_at = now
        elif status == "expired":
            batch.expired_at = now
        elif status == "cancelling":
            batch.cancelling_at = now
        elif status == "cancelled":
            batch.cancelled_at = now
        self._store.save_batch(run.stored)

    def _error_line(self, request: BatchRequest, code: str, message: str) -> bytes:
        return error_line(self._store.random_id("batch_req_"), request.custom_id, code, message)

    def _written(self, run: Run, request: BatchRequest, line: bytes, good: bool) -> bool:
        """Whether the request's line was written; if not (a full disk), the request goes
        back to its batch, to run again `STORE_RETRY_S` later."""
        try:
            self._write(run, line, good)
        except Exception:
            log.exception("batch %s: cannot write the line of %r; it runs again later",
                          run.stored.batch.id, request.custom_id)  # fmt: skip
            run.pending.appendleft(request)
            run.not_before = max(run.not_before, self._clock() + STORE_RETRY_S)
            return False
        return True

    def _write(self, run: Run, line: bytes, good: bool) -> None:
        stored = run.stored
        self._store.append(stored.output_id if good else stored.error_id, line)
        if good:
            run.completed += 1
        else:
            run.failed += 1


def _logged(delete: Callable[[str], None], item_id: str) -> None:
    try:
        delete(item_id)
    except OSError:
        log.exception("batches: cannot delete %s now; tried again", item_id)


def _counts(run: Run) -> RequestCounts:
    total = run.completed + run.failed + run.in_flight + len(run.pending)
    total = max(total, run.stored.batch.request_counts.total)
    return RequestCounts(total=total, completed=run.completed, failed=run.failed)


def _usage(run: Run) -> BatchUsage:
    total = run.input_tokens + run.output_tokens
    return BatchUsage(
        input_tokens=run.input_tokens, output_tokens=run.output_tokens, total_tokens=total
    )
