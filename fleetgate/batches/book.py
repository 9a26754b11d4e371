"""Batches as their clients and the runner see them: created (checked, then started or
failed), got, listed, cancelled; the requests of those running taken and handed back; and,
after a restart, resumed. How a running batch moves from status to status is running.py's.

The runner (runner.py) takes requests with `take` and hands each back with `record`, `fail` or
`defer` (a 429 or 503: back at the front of its batch, which starts nothing before the time
given). `take` goes round robin across tenants, then across each tenant's batches, so neither a
tenant with many batches nor one whose requests wait can hold every worker. `resume` picks up,
after a restart, every batch still running: requests with a line in either file are not run
again.

A book `shared` with other gateways (one directory, `state.url` set) runs batches only while
`running_here` (sharing.py: while it holds the lease): `refresh` reads what the others wrote
before each look, a batch created while another gateway runs them is written `in_progress`
for that one to take up (`resume` again), a cancel is asked of it by a marker, and
`save_progress` writes the counts of the batches running here for the others to show; `tell`
marks each change for the others, and `refresh` reads the directory only when the mark moved.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping

import msgspec

from fleetgate.batches.ids import valid_id
from fleetgate.batches.objects import ACTIVE, Batch, BatchError, StoredBatch
from fleetgate.batches.pages import page
from fleetgate.batches.results import answer_line, read_back, tokens
from fleetgate.batches.running import Run, RunningBatches
from fleetgate.batches.settings import BatchesSettings
from fleetgate.batches.store import BatchStore
from fleetgate.batches.validation import (
    ENDPOINTS,
    BatchRequest,
    Checked,
    check_input,
    check_metadata,
)
from fleetgate.shared.changes import ChangeMark
from fleetgate.traffic.door import Caller, Refused
from fleetgate.traffic.tenants import Tenant

log = logging.getLogger(__name__)

WINDOW_S = 86400  # "24h", the only completion window


class BatchBook:
    """Every batch of the store, and the requests of those running (module docstring)."""

    def __init__(
        self,
        store: BatchStore,
        settings: BatchesSettings,
        tenants: Mapping[str, Tenant],
        wall_clock: Callable[[], float],
        keys: frozenset[tuple[str, str]] | None = None,
        *,
        changes: ChangeMark | None = None,
    ) -> None:
        self._store = store
        # Shared with other gateways: the mark of the directory's last change (shared/changes.py)
        self._changes = changes
        self.shared = changes is not None
        self.running_here = not self.shared  # shared: until it takes the batches over
        self._looked: bytes | None = None  # the mark at the last look (None: look)
        self._told = 0  # the store's writes when the others were last told of them
        self._settings = settings
        self._tenants = tenants  # the config's: a batch runs as its tenant as configured now
        self._keys = keys  # (tenant, key id) of the keys configured now; None: auth off
        self._clock = wall_clock
        self._running = RunningBatches(store, settings, wall_clock)
        self._last_tenant = ""  # the round robin's last turns: the tenant's name...
        self._last_run: dict[str, int] = {}  # ...and, for each tenant, its batch's seq
        self.on_work: Callable[[], None] = lambda: None  # requests to take: the runner's wake

    async def refresh(self) -> None:
        """Shared: read what the other gateways wrote (the batches running here excepted),
        unless the directory's mark says nothing changed since the last look."""
        if self._changes is None:
            return
        mark = await self._changes.read()
        if mark is not None and mark == self._looked:
            return
        await self._store.refresh(self._running.batches.keys())
        self._looked = mark

    async def tell(self) -> None:
        """Shared: tell the other gateways this one changed the directory, if it did."""
        writes = self._store.writes
        if self._changes is not None and writes != self._told and await self._changes.changed():
            self._told = writes

    def configure(
        self, tenants: Mapping[str, Tenant], keys: frozenset[tuple[str, str]] | None
    ) -> None:
        """The tenants and keys of a reloaded config: a batch runs as its tenant is now, and one
        whose key is no longer configured is refused."""
        self._tenants = tenants
        self._keys = keys

    def take_over(self) -> None:
        """Run the batches from now on: every one still running, wherever it started."""
        self.running_here = True
        self.resume()

    def hand_over(self) -> None:
        """Run nothing from now on (the runner has stopped): another gateway resumes them."""
        self.running_here = False
        self._running.batches.clear()

    def resume(self) -> None:
        """Pick up the batches still running that this book does not run yet: after a
        restart, those a previous run of the gateway left; shared, those made elsewhere.
        Shared and not running them here: none."""
        if not self.running_here:
            return
        running = self._running.batches
        active = [
            s for s in self._store.batches.values()
            if s.batch.status in ACTIVE and s.batch.id not in running
        ]  # fmt: skip
        for stored in sorted(active, key=lambda s: s.batch.created_at):
            try:
                self._reopen(stored)
            except Exception:  # its files cannot be read or written: the others go on
                log.exception("batches: cannot resume batch %s; it fails", stored.batch.id)
                self._unresumable(stored)  # out of the batches running, if it was added
        if self._running.batches:
            self.on_work()

    def _unresumable(self, stored: StoredBatch) -> None:
        """Failed, not left running on disk where nothing would ever run, expire or delete
        it (and it would count towards its tenant's batches)."""
        message = "The batch could not be resumed after a restart; create it again."
        try:
            self._running.fail(
                Run(stored, deque()), [BatchError(code="resume_failed", message=message)]
            )
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
        run = self._running.add(Run(stored, deque()))
        answered = read_back(self._store.lines(stored.output_id))
        failed = read_back(self._store.lines(stored.error_id))
        run.completed, run.failed = answered.lines, failed.lines
        run.input_tokens, run.output_tokens = answered.input_tokens, answered.output_tokens
        done = answered.custom_ids | failed.custom_ids
        if checked.errors and not done:  # its requests are gone (the store was tampered with)
            message = "The batch's requests could not be read back after a restart."
            checked.errors = [BatchError(code="input_lost", message=message)]
            self._running.fail(run, checked.errors)
            return
        run.pending.extend(r for r in checked.requests if r.custom_id not in done)
        if batch.status == "validating":  # created just before a crash
            self._running.change(run, "in_progress")
        self._running.settle(run)

    # What clients ask.

    async def create(
        self,
        caller: Caller,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str] | None,
    ) -> Batch:
        """A new batch, checked and started (or failed, with its input file's errors);
        `Refused` (400) for what the request itself gets wrong. Its file is read and checked
        in a thread: a file of 50,000 lines would hold every other request of the gateway
        for a tenth of a second or more."""
        stored = self._open(caller, input_file_id, endpoint, completion_window, metadata)
        checked = await asyncio.to_thread(self._read, stored)
        self._check_room(stored.owner)  # again: others may have started meanwhile
        return self._start(stored, checked)

    def _open(
        self,
        caller: Caller,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str] | None,
    ) -> StoredBatch:
        """The new batch, `validating`, once what the request says is checked."""
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
        self._check_room(owner)
        now = int(self._clock())
        store = self._store
        batch = Batch(
            id=store.new_id("batch_"), endpoint=endpoint, input_file_id=input_file_id,
            completion_window=completion_window, status="validating", created_at=now,
            expires_at=now + WINDOW_S, metadata=metadata,
        )  # fmt: skip
        return StoredBatch(
            batch=batch, owner=owner, key_id=caller.key_id, output_id=store.new_id("file-"),
            error_id=store.new_id("file-"),
        )  # fmt: skip

    def _read(self, stored: StoredBatch) -> Checked:
        """The batch's input file, read and checked line by line (no state is changed: it
        may run in a thread)."""
        batch = stored.batch
        try:
            data = self._store.content(batch.input_file_id)
        except OSError:
            message = "The input file's content is gone; upload it again."
            raise Refused(400, message, "invalid_value", param="input_file_id") from None
        return check_input(data, batch.endpoint, self._settings.max_requests)

    def _start(self, stored: StoredBatch, checked: Checked) -> Batch:
        """Start the batch on its checked input, or fail it with the input's errors."""
        batch = stored.batch
        run = Run(stored, deque(checked.requests))
        if checked.errors:
            self._running.fail(run, checked.errors)
            return batch
        batch.request_counts.total = len(checked.requests)
        batch.model = checked.model
        self._store.keep_input(batch.id, batch.input_file_id)
        if self.running_here:  # else the gateway running the batches takes it up
            self._running.add(run)
        self._running.change(run, "in_progress")
        self.on_work()
        return self.view(stored)

    def _check_room(self, owner: str) -> None:
        """`Refused` over the caps on batches kept (400) and running (429)."""
        kept = sum(1 for s in self._store.batches.values() if s.owner == owner)
        if kept >= self._settings.max_batches_per_tenant:
            raise Refused(
                400, f"You keep {kept} batches, the most allowed here "
                "(`batches.max_batches_per_tenant`); they go `batches.retention_s` after they "
                "end.", "too_many_batches",
            )  # fmt: skip
        self._check_running(owner)

    def _check_running(self, owner: str) -> None:
        """`Refused` (429) over the caps on batches running, which bound their memory."""
        settings = self._settings
        active = [s for s in self._store.batches.values() if s.batch.status in ACTIVE]
        mine = sum(1 for s in active if s.owner == owner)
        if mine >= settings.max_running_batches_per_tenant:
            raise Refused(
                429, f"You have {mine} batches running, the most allowed here "
                "(`batches.max_running_batches_per_tenant`); create this one once one of them "
                "has ended, or put more requests in one batch.", "too_many_running_batches",
            )  # fmt: skip
        if len(active) >= settings.max_running_batches:
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
        if status != "in_progress":
            return self.view(stored)
        run = self._running.batches.get(batch_id)
        if run is not None:
            self._cancel(run)
            return self.view(stored)
        # Shared: run by another gateway (or not taken up yet): it is asked, and cancels it at
        # its next look, unless it ends first.
        self._store.ask_cancel(batch_id)
        return msgspec.structs.replace(stored.batch, status="cancelling")

    def _cancel(self, run: Run) -> None:
        self._running.change(run, "cancelling")
        self._running.settle(run)

    def apply_cancels(self) -> None:
        """Cancel the batches running here that another gateway was asked to cancel."""
        for batch_id in self._store.cancels:
            run = self._running.batches.get(batch_id)
            if run is not None and run.stored.batch.status == "in_progress":
                self._cancel(run)

    def save_progress(self) -> None:
        """Write the counts of each batch running here that changed since last written (for
        the other gateways' clients). One the store cannot write now is tried again next."""
        for run in list(self._running.batches.values()):
            batch = run.stored.batch
            counts = run.counts()
            if counts == batch.request_counts:
                continue
            batch.request_counts, batch.usage = counts, run.usage()
            try:
                self._store.save_batch(run.stored, durable=False)
            except OSError:
                log.exception("batches: cannot write the counts of batch %s now", batch.id)

    def listing(self, owner: str, limit: int, after: str | None) -> tuple[list[Batch], bool]:
        """The owner's batches, newest first, from the one after `after`; and whether more
        follow."""
        mine = [s for s in self._store.batches.values() if s.owner == owner]
        mine.sort(key=lambda s: (s.batch.created_at, s.batch.id), reverse=True)
        shown, more = page(mine, lambda s: s.batch.id, limit, after)
        return [self.view(s) for s in shown], more

    def view(self, stored: StoredBatch) -> Batch:
        """The batch as a client sees it: with a running batch's counts of the moment; shared,
        `cancelling` once asked, before the gateway running it has acted."""
        batch = stored.batch
        run = self._running.batches.get(batch.id)
        if run is None:
            if batch.status == "in_progress" and batch.id in self._store.cancels:
                return msgspec.structs.replace(batch, status="cancelling")
            return batch
        return msgspec.structs.replace(batch, request_counts=run.counts(), usage=run.usage())

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
        for run in self._running.batches.values():
            if run.pending and run.not_before <= now and run.may_start(now):
                ready.setdefault(run.stored.owner, []).append(run)
        if not ready:
            return None
        # The first after the last turn's, else the first: fair while batches come and go.
        owners = sorted(ready)
        owner = next((o for o in owners if o > self._last_tenant), owners[0])
        runs = ready[owner]  # by seq: `batches` keeps the order they were added in
        last = self._last_run.get(owner, 0)
        run = next((r for r in runs if r.seq > last), runs[0])
        self._last_tenant, self._last_run[owner] = owner, run.seq
        run.in_flight += 1
        return run, run.pending.popleft()

    def ready_at(self) -> float | None:
        """The wall time the first deferred request may start; None when none waits."""
        now = self._clock()
        waiting = [
            r.not_before for r in self._running.batches.values() if r.pending and r.may_start(now)
        ]
        return min(waiting, default=None)

    def now(self) -> float:
        """The book's wall clock: what `defer`'s times are measured on."""
        return self._clock()

    def running(self, run: Run) -> bool:
        """Whether the batch may still start requests (not cancelled, nor past its window)."""
        return run.may_start(self._clock())

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
        if self._running.write(run, request, line, good) and good:
            prompt, completion = tokens(body)
            run.input_tokens += prompt
            run.output_tokens += completion
        self._running.settle(run)

    def fail(self, run: Run, request: BatchRequest, code: str, message: str) -> None:
        """A request the gateway could not run at all."""
        run.in_flight -= 1
        line = self._running.error_line(request, code, message)
        self._running.write(run, request, line, False)
        self._running.settle(run)

    def defer(self, run: Run, request: BatchRequest, not_before: float) -> None:
        """A request turned away for now (429, 503): it goes first again, and its batch starts
        nothing before `not_before` (a rate limit or a missing backend is the batch's, not
        one request's)."""
        run.in_flight -= 1
        self._running.defer(run, request, not_before)
        self._running.settle(run)

    def tick(self) -> None:
        """End what has ended (a window passed with nothing in flight), and delete the
        batches and files past their retention."""
        self._running.tick()
