"""The state machine of a running batch, driven by the injected wall clock:

    validating -> in_progress -> finalizing -> completed
    validating -> failed                 the input file has errors (`errors`, line by line)
    in_progress -> cancelling -> cancelled    no request starts; those in flight end first
    in_progress -> expired               past its 24 h window; what never ran is written to
                                         the error file with code `batch_expired`

A result is appended to the output file (2xx) or the error file (anything else) as it comes; a
batch's object is written at each change of status. What the store cannot write now (a full
disk) is logged and tried again: a request's line by running it again later, a batch's end at
the next `tick`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from fleetgate.batches.objects import (
    BatchError,
    BatchUsage,
    Errors,
    FileObject,
    RequestCounts,
    Status,
    StoredBatch,
)
from fleetgate.batches.results import error_line
from fleetgate.batches.settings import BatchesSettings
from fleetgate.batches.store import BatchStore
from fleetgate.batches.validation import BatchRequest

log = logging.getLogger(__name__)

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

    def may_start(self, now: float) -> bool:
        """Whether it may still start requests at `now` (not cancelled, nor past its window)."""
        batch = self.stored.batch
        return batch.status == "in_progress" and now < (batch.expires_at or now + 1)

    def counts(self) -> RequestCounts:
        total = self.completed + self.failed + self.in_flight + len(self.pending)
        total = max(total, self.stored.batch.request_counts.total)
        return RequestCounts(total=total, completed=self.completed, failed=self.failed)

    def usage(self) -> BatchUsage:
        total = self.input_tokens + self.output_tokens
        return BatchUsage(
            input_tokens=self.input_tokens, output_tokens=self.output_tokens, total_tokens=total
        )


class RunningBatches:
    """The batches running, each moved from status to status (module docstring)."""

    def __init__(
        self, store: BatchStore, settings: BatchesSettings, wall_clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._settings = settings
        self._clock = wall_clock
        self.batches: dict[str, Run] = {}  # by id, oldest first
        self._seq = 0  # the last Run.seq given

    def add(self, run: Run) -> Run:
        self._seq += 1
        run.seq = self._seq
        self.batches[run.stored.batch.id] = run
        return run

    def settle(self, run: Run) -> None:
        """Move the batch on if nothing of it is in flight and it is done, cancelled or past
        its window. What its store cannot write now (a full disk) is logged, and the next
        `tick` tries again."""
        try:
            self._move_on(run)
        except Exception:
            log.exception("batches: cannot end batch %s now; tried again", run.stored.batch.id)

    def defer(self, run: Run, request: BatchRequest, not_before: float) -> None:
        """The request goes first again, and its batch starts nothing before `not_before`."""
        run.pending.appendleft(request)
        run.not_before = max(run.not_before, not_before)

    def write(self, run: Run, request: BatchRequest, line: bytes, good: bool) -> bool:
        """Whether the request's line was written, to the output file when `good`, else to the
        error file; if not (a full disk), the request is deferred `STORE_RETRY_S`."""
        stored = run.stored
        try:
            self._store.append(stored.output_id if good else stored.error_id, line)
        except Exception:
            log.exception("batch %s: cannot write the line of %r; it runs again later",
                          stored.batch.id, request.custom_id)  # fmt: skip
            self.defer(run, request, self._clock() + STORE_RETRY_S)
            return False
        if good:
            run.completed += 1
        else:
            run.failed += 1
        return True

    def error_line(self, request: BatchRequest, code: str, message: str) -> bytes:
        return error_line(self._store.random_id("batch_req_"), request.custom_id, code, message)

    def fail(self, run: Run, errors: list[BatchError]) -> None:
        batch = run.stored.batch
        batch.errors = Errors(data=errors)
        self.batches.pop(batch.id, None)
        self.change(run, "failed")
        _logged(self._store.delete_input, batch.id)

    def change(self, run: Run, status: Status) -> None:
        """The batch's new status and its time, written at once."""
        batch = run.stored.batch
        now = int(self._clock())
        batch.status = status
        if status != "validating":  # every other status has its time: in_progress_at, ...
            setattr(batch, f"{status}_at", now)
        self._store.save_batch(run.stored)

    def tick(self) -> None:
        """End what has ended (a window passed with nothing in flight), and delete the
        batches and files past their retention."""
        for run in list(self.batches.values()):
            self.settle(run)  # each on its own: one that fails stops none of the others
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
        elif status == "in_progress" and not run.may_start(self._clock()):
            message = "The batch's 24h completion window ended before this request ran."
            lines = [self.error_line(r, "batch_expired", message) for r in run.pending]
            self._store.append(run.stored.error_id, *lines)  # one write for up to 50k lines
            run.failed += len(lines)
            run.pending.clear()
            self._end(run, "expired")

    def _end(self, run: Run, status: Status) -> None:
        run.ending = status
        stored, batch = run.stored, run.stored.batch
        batch.request_counts, batch.usage = run.counts(), run.usage()
        if status == "completed" and batch.finalizing_at is None:
            self.change(run, "finalizing")
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
        self.change(run, status)
        del self.batches[batch.id]
        _logged(self._store.delete_input, batch.id)


def _logged(delete: Callable[[str], None], item_id: str) -> None:
    try:
        delete(item_id)
    except OSError:
        log.exception("batches: cannot delete %s now; tried again", item_id)
