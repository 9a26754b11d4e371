"""Batches from creation to their end on a real store in a temporary directory, with the wall
clock injected: completion, failed validation, cancel, expiry, retention, ownership, and a
gateway's restart (the store reopened) resuming what was running."""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from fleetgate.batches.book import WINDOW_S, BatchBook
from fleetgate.batches.files import FileShelf
from fleetgate.batches.objects import FileObject, StoredFile
from fleetgate.batches.running import STORE_RETRY_S
from fleetgate.batches.settings import BatchesSettings
from fleetgate.batches.store import BatchStore
from fleetgate.traffic.door import Caller, Refused
from fleetgate.traffic.tenants import ANONYMOUS, Tenant, TenantSettings
from tests.batches.test_batch_store import SEED, Clock

CHAT = "/v1/chat/completions"
ALICE = Tenant.of(TenantSettings(name="alice"))
BOB = Tenant.of(TenantSettings(name="bob"))
TENANTS = {"alice": ALICE, "bob": BOB}
SETTINGS = BatchesSettings(retention_s=1000.0)
ANSWER = b'{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}'


def _input(n: int) -> bytes:
    lines = (
        {"custom_id": f"r{i}", "method": "POST", "url": CHAT,
         "body": {"model": "m", "messages": [{"role": "user", "content": str(i)}]}}
        for i in range(n)
    )  # fmt: skip
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def upload(shelf: FileShelf, owner: str, data: bytes) -> FileObject:
    return asyncio.run(shelf.upload(owner, "in.jsonl", "batch", data))


class Setup:
    def __init__(
        self, root: Path, clock: Clock, tenants: dict[str, Tenant] = TENANTS,
        settings: BatchesSettings = SETTINGS, keys: frozenset[tuple[str, str]] | None = None,
    ) -> None:  # fmt: skip
        self.store = BatchStore(root, random.Random(SEED))
        self.store.load()
        self.clock = clock
        self.shelf = FileShelf(self.store, settings, clock)
        self.book = BatchBook(self.store, settings, tenants, clock, keys)
        self.book.resume()

    def start(self, n: int, owner: Tenant = ALICE) -> str:
        file = upload(self.shelf, owner.name, _input(n))
        batch = asyncio.run(
            self.book.create(Caller(owner, "k1"), file.id, CHAT, "24h", {"job": "x"})
        )
        assert batch.status == "in_progress"
        return batch.id

    def lines(self, file_id: str | None) -> list[dict[str, Any]]:
        assert file_id is not None
        return [json.loads(line) for line in self.store.content(file_id).splitlines()]


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path, Clock(1_000_000.0))


def test_a_batch_runs_to_completed_with_its_answers_in_the_output_file(setup: Setup) -> None:
    book = setup.book
    batch_id = setup.start(3)
    taken = [book.take() for _ in range(3)]
    assert book.take() is None
    for i, job in enumerate(taken):
        assert job is not None
        run, request = job
        assert book.get("alice", batch_id).status == "in_progress"
        book.record(run, request, 200 if i < 2 else 400, f"rid-{i}", ANSWER)
    batch = book.get("alice", batch_id)
    assert batch.status == "completed" and batch.completed_at == 1_000_000
    assert batch.finalizing_at == 1_000_000 and batch.in_progress_at == 1_000_000
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (3, 2, 1)
    assert (batch.usage.input_tokens, batch.usage.output_tokens) == (6, 4)
    output = setup.lines(batch.output_file_id)
    assert [line["custom_id"] for line in output] == ["r0", "r1"]
    assert output[0]["response"] == {"status_code": 200, "request_id": "rid-0",
                                     "body": json.loads(ANSWER)}  # fmt: skip
    assert output[0]["error"] is None and str(output[0]["id"]).startswith("batch_req_")
    errors = setup.lines(batch.error_file_id)
    assert [line["custom_id"] for line in errors] == ["r2"]
    assert setup.shelf.get("alice", batch.output_file_id or "").purpose == "batch_output"


def test_a_file_with_a_bad_line_makes_a_failed_batch(setup: Setup) -> None:
    data = _input(1) + b'{"custom_id": "x"}\n'
    file = upload(setup.shelf, "alice", data)
    batch = asyncio.run(setup.book.create(Caller(ALICE, "k1"), file.id, CHAT, "24h", None))
    assert batch.status == "failed" and batch.failed_at == 1_000_000
    assert batch.errors is not None
    assert [(e.code, e.line) for e in batch.errors.data] == [("missing_required_parameter", 2)]
    assert setup.book.take() is None


def test_cancel_stops_new_requests_and_ends_once_those_in_flight_end(setup: Setup) -> None:
    book = setup.book
    batch_id = setup.start(4)
    job = book.take()
    assert job is not None
    assert book.cancel("alice", batch_id).status == "cancelling"
    assert book.take() is None  # nothing more starts
    book.record(*job, 200, "rid", ANSWER)
    batch = book.get("alice", batch_id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    assert (batch.request_counts.completed, batch.request_counts.total) == (1, 4)
    assert [line["custom_id"] for line in setup.lines(batch.output_file_id)] == ["r0"]
    assert book.cancel("alice", batch_id).status == "cancelled"  # again: the same answer


def test_only_a_batch_in_progress_can_be_cancelled(setup: Setup) -> None:
    file = upload(setup.shelf, "alice", b"{}\n")
    failed = asyncio.run(setup.book.create(Caller(ALICE, "k1"), file.id, CHAT, "24h", None))
    with pytest.raises(Refused) as info:
        setup.book.cancel("alice", failed.id)
    assert info.value.status == 409


def test_past_its_window_a_batch_expires_and_what_never_ran_is_an_error(setup: Setup) -> None:
    book = setup.book
    batch_id = setup.start(3)
    job = book.take()
    assert job is not None
    setup.clock.now += WINDOW_S
    assert book.take() is None
    book.record(*job, 200, "rid", ANSWER)
    batch = book.get("alice", batch_id)
    assert batch.status == "expired" and batch.expired_at == 1_000_000 + WINDOW_S
    errors = setup.lines(batch.error_file_id)
    assert [e["custom_id"] for e in errors] == ["r1", "r2"]
    assert all(e["error"]["code"] == "batch_expired" and e["response"] is None for e in errors)
    assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 2)


def test_a_tick_expires_a_batch_with_nothing_in_flight(setup: Setup) -> None:
    batch_id = setup.start(2)
    setup.clock.now += WINDOW_S + 1
    setup.book.tick()
    assert setup.book.get("alice", batch_id).status == "expired"


def test_batches_and_files_go_after_their_retention(setup: Setup) -> None:
    batch_id = setup.start(1)
    job = setup.book.take()
    assert job is not None
    setup.book.record(*job, 200, "rid", ANSWER)
    setup.clock.now += SETTINGS.retention_s
    setup.book.tick()
    assert not setup.store.batches and not setup.store.files
    with pytest.raises(Refused):
        setup.book.get("alice", batch_id)


def test_another_tenant_s_batch_and_file_are_not_found(setup: Setup) -> None:
    batch_id = setup.start(1)
    file_id = setup.book.get("alice", batch_id).input_file_id
    asks = [
        lambda: setup.book.get("bob", batch_id),
        lambda: setup.book.cancel("bob", batch_id),
        lambda: setup.shelf.get("bob", file_id),
        lambda: setup.book.get("alice", "../x"),
    ]
    for ask in asks:
        with pytest.raises(Refused) as info:
            ask()
        assert info.value.status == 404
    assert setup.book.listing("bob", 20, None) == ([], False)
    with pytest.raises(Refused) as info:  # nor may it run one from alice's file
        asyncio.run(setup.book.create(Caller(BOB, "k2"), file_id, CHAT, "24h", None))
    assert info.value.status == 400 and info.value.param == "input_file_id"


@pytest.mark.parametrize(
    ("endpoint", "window", "metadata", "param"),
    [
        ("/v1/moderations", "24h", None, "endpoint"),
        (CHAT, "1h", None, "completion_window"),
        (CHAT, "24h", {str(i): "v" for i in range(17)}, "metadata"),
        (CHAT, "24h", {"k": "v" * 513}, "metadata"),
    ],
)
def test_a_bad_request_is_a_400_naming_its_field(
    setup: Setup, endpoint: str, window: str, metadata: dict[str, str] | None, param: str
) -> None:
    file = upload(setup.shelf, "alice", _input(1))
    with pytest.raises(Refused) as info:
        asyncio.run(setup.book.create(Caller(ALICE, "k1"), file.id, endpoint, window, metadata))
    assert (info.value.status, info.value.param) == (400, param)


def test_listing_is_newest_first_and_pages_with_after(setup: Setup) -> None:
    ids = []
    for _ in range(3):
        ids.append(setup.start(1))
        setup.clock.now += 1
    page, more = setup.book.listing("alice", 2, None)
    assert [b.id for b in page] == ids[::-1][:2] and more
    page, more = setup.book.listing("alice", 2, ids[1])
    assert [b.id for b in page] == [ids[0]] and not more


def test_a_restart_resumes_without_running_an_answered_request_again(tmp_path: Path) -> None:
    clock = Clock(1_000_000.0)
    first = Setup(tmp_path, clock)
    batch_id = first.start(4)
    jobs = [first.book.take() for _ in range(3)]
    assert jobs[0] is not None and jobs[1] is not None
    first.book.record(*jobs[0], 200, "rid", ANSWER)
    first.book.record(*jobs[1], 500, "rid", b"oops")
    stored = first.store.batches[batch_id]
    with (tmp_path / "files" / f"{stored.output_id}.jsonl").open("ab") as out:
        out.write(b'{"id":"batch_req_x","custom_id":"r2","resp')  # the crash cut this line
    # The gateway stops (r2 in flight, r3 never started) and a new one opens the same store.
    second = Setup(tmp_path, clock)
    assert second.book.get("alice", batch_id).request_counts.completed == 1
    left = []
    while (job := second.book.take()) is not None:
        left.append(job)
    assert sorted(request.custom_id for _, request in left) == ["r2", "r3"]
    for job in left:
        second.book.record(*job, 200, "rid", ANSWER)
    batch = second.book.get("alice", batch_id)
    assert batch.status == "completed"
    answered = [line["custom_id"] for line in second.lines(batch.output_file_id)]
    answered += [line["custom_id"] for line in second.lines(batch.error_file_id)]
    assert sorted(answered) == ["r0", "r1", "r2", "r3"]


def test_a_restart_finishes_a_batch_that_was_cancelling(tmp_path: Path) -> None:
    clock = Clock(1_000_000.0)
    first = Setup(tmp_path, clock)
    batch_id = first.start(2)
    assert first.book.take() is not None
    first.book.cancel("alice", batch_id)
    second = Setup(tmp_path, clock)  # what was in flight went with the old process
    assert second.book.get("alice", batch_id).status == "cancelled"


def test_a_batch_whose_tenant_left_the_config_has_no_caller(tmp_path: Path) -> None:
    clock = Clock(1_000_000.0)
    Setup(tmp_path, clock).start(1)
    second = Setup(tmp_path, clock, tenants={"bob": BOB})
    job = second.book.take()
    assert job is not None
    assert second.book.caller(job[0]) is None
    second.book.fail(*job, "tenant_not_found", "gone")
    batch = second.book.get("alice", job[0].stored.batch.id)
    assert batch.status == "completed" and batch.request_counts.failed == 1


def test_take_goes_round_robin_across_tenants_then_across_their_batches(setup: Setup) -> None:
    alices = [setup.start(2) for _ in range(3)]
    bobs = setup.start(2, owner=BOB)
    taken = []
    for _ in range(4):
        job = setup.book.take()
        assert job is not None
        taken.append(job[0].stored.batch.id)
    assert taken == [alices[0], bobs, alices[1], bobs]  # not alice's three batches first


def test_a_deferred_request_goes_first_once_its_time_has_come(setup: Setup) -> None:
    book = setup.book
    alices = setup.start(2)
    bobs = setup.start(1, owner=BOB)
    job = book.take()
    assert job is not None and job[0].stored.batch.id == alices
    book.defer(*job, setup.clock.now + 10)
    ready = book.ready_at()
    assert ready is not None and ready <= setup.clock.now  # bob's is ready now
    later = book.take()
    assert later is not None and later[0].stored.batch.id == bobs
    assert book.take() is None  # alice's starts nothing before its time
    assert book.ready_at() == setup.clock.now + 10
    setup.clock.now += 10
    again = book.take()
    assert again is not None and again[1].custom_id == "r0"
    assert book.get("alice", alices).status == "in_progress"


def _disk_full(*args: object) -> None:
    raise OSError(28, "No space left on device")


def test_a_publish_that_fails_is_tried_again_by_the_next_tick(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = setup.start(1)
    job = setup.book.take()
    assert job is not None
    with monkeypatch.context() as patch:
        patch.setattr(setup.store, "publish", _disk_full)
        setup.book.record(*job, 200, "rid", ANSWER)  # logged, not raised
        assert job[0].in_flight == 0
        assert setup.book.get("alice", batch_id).status == "finalizing"
        setup.book.tick()
        assert setup.book.get("alice", batch_id).status == "finalizing"
    setup.book.tick()
    batch = setup.book.get("alice", batch_id)
    assert batch.status == "completed" and batch.request_counts.completed == 1
    assert [line["custom_id"] for line in setup.lines(batch.output_file_id)] == ["r0"]
    assert batch.error_file_id is None  # not also failed as a gateway_error


def test_a_line_that_cannot_be_written_runs_again_later(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = setup.start(2)
    job = setup.book.take()
    assert job is not None
    with monkeypatch.context() as patch:
        patch.setattr(setup.store, "append", _disk_full)
        setup.book.record(*job, 200, "rid", ANSWER)
    assert job[0].in_flight == 0 and setup.book.take() is None  # the batch waits a while
    setup.clock.now += STORE_RETRY_S
    again = setup.book.take()
    assert again is not None and again[1].custom_id == "r0"
    setup.book.record(*again, 200, "rid", ANSWER)
    last = setup.book.take()
    assert last is not None
    setup.book.record(*last, 200, "rid", ANSWER)
    batch = setup.book.get("alice", batch_id)
    assert batch.status == "completed" and batch.request_counts.completed == 2


def test_a_batch_that_cannot_end_stops_no_other_s_end(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    stuck, other = setup.start(1), setup.start(1, owner=BOB)
    stuck_errors = setup.store.batches[stuck].error_id
    append = setup.store.append

    def full_for_one(file_id: str, *lines: bytes) -> None:
        if file_id == stuck_errors:
            _disk_full()
        append(file_id, *lines)

    monkeypatch.setattr(setup.store, "append", full_for_one)
    setup.clock.now += WINDOW_S
    setup.book.tick()
    assert setup.book.get("alice", stuck).status == "in_progress"
    assert setup.book.get("bob", other).status == "expired"
    monkeypatch.undo()
    setup.book.tick()
    assert setup.book.get("alice", stuck).status == "expired"


def test_a_batch_that_cannot_be_resumed_fails_instead_of_staying_in_progress(
    tmp_path: Path,
) -> None:
    clock = Clock(1_000_000.0)
    first = Setup(tmp_path, clock)
    batch_id = first.start(2)
    output = tmp_path / "files" / f"{first.store.batches[batch_id].output_id}.jsonl"
    output.mkdir(parents=True)  # its results file can no longer be read
    second = Setup(tmp_path, clock)
    batch = second.book.get("alice", batch_id)
    assert batch.status == "failed" and batch.failed_at == 1_000_000
    assert batch.errors is not None and batch.errors.data[0].code == "resume_failed"
    assert second.book.take() is None
    third = Setup(tmp_path, clock)  # as it is on disk
    assert third.book.get("alice", batch_id).status == "failed"


def test_a_batch_resumes_under_a_lower_max_requests(tmp_path: Path) -> None:
    clock = Clock(1_000_000.0)
    batch_id = Setup(tmp_path, clock).start(3)
    second = Setup(tmp_path, clock, settings=BatchesSettings(max_requests=2))
    assert second.book.get("alice", batch_id).status == "in_progress"
    taken = [second.book.take() for _ in range(4)]
    assert [job[1].custom_id for job in taken if job is not None] == ["r0", "r1", "r2"]


@pytest.mark.parametrize(
    ("caps", "owner", "says"),
    [
        ({"max_running_batches_per_tenant": 2}, ALICE, "max_running_batches_per_tenant"),
        ({"max_running_batches": 2}, BOB, "max_running_batches`"),
    ],
)
def test_batches_running_at_once_are_capped(
    tmp_path: Path, caps: dict[str, int], owner: Tenant, says: str
) -> None:
    setup = Setup(tmp_path, Clock(1_000_000.0), settings=BatchesSettings(**caps))
    first = setup.start(1)
    setup.start(1)
    file = upload(setup.shelf, owner.name, _input(1))
    with pytest.raises(Refused) as info:
        asyncio.run(setup.book.create(Caller(owner, "k1"), file.id, CHAT, "24h", None))
    assert (info.value.status, info.value.code) == (429, "too_many_running_batches")
    assert says in info.value.message
    setup.book.cancel("alice", first)  # one ends: room for another
    assert (
        asyncio.run(setup.book.create(Caller(owner, "k1"), file.id, CHAT, "24h", None)).status
        == "in_progress"
    )


def test_result_lines_count_in_stored_bytes_as_they_are_written(setup: Setup) -> None:
    batch_id = setup.start(2)
    uploaded = setup.store.stored_bytes
    first = setup.book.take()
    assert first is not None
    setup.book.record(*first, 200, "rid", ANSWER)
    output_id = setup.store.batches[batch_id].output_id
    assert setup.store.stored_bytes == uploaded + setup.store.size(output_id)  # not yet published
    second = setup.book.take()
    assert second is not None
    setup.book.record(*second, 500, "rid", b"oops")
    batch = setup.book.get("alice", batch_id)
    results = [setup.store.size(f or "") for f in (batch.output_file_id, batch.error_file_id)]
    assert setup.store.stored_bytes == uploaded + sum(results)  # published: counted once
    again = BatchStore(setup.store.root, random.Random(SEED))
    again.load()
    assert again.stored_bytes == setup.store.stored_bytes


@pytest.mark.parametrize("end", ["completed", "cancelled", "expired"])
def test_a_batch_s_input_copy_goes_when_it_ends(setup: Setup, end: str) -> None:
    batch_id = setup.start(1)
    copy = setup.store.root / "batches" / f"{batch_id}.input.jsonl"
    assert copy.exists()
    if end == "completed":
        job = setup.book.take()
        assert job is not None
        setup.book.record(*job, 200, "rid", ANSWER)
    elif end == "cancelled":
        setup.book.cancel("alice", batch_id)
    else:
        setup.clock.now += WINDOW_S
        setup.book.tick()
    assert setup.book.get("alice", batch_id).status == end
    assert not copy.exists()


def test_expiry_writes_what_never_ran_in_one_write(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = setup.start(50)
    writes: list[int] = []
    append = setup.store.append

    def counted(file_id: str, *lines: bytes) -> None:
        writes.append(len(lines))
        append(file_id, *lines)

    monkeypatch.setattr(setup.store, "append", counted)
    setup.clock.now += WINDOW_S
    setup.book.tick()
    batch = setup.book.get("alice", batch_id)
    assert batch.status == "expired" and writes == [50]
    assert len(setup.lines(batch.error_file_id)) == 50


def test_an_upload_is_written_off_the_event_loop(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []
    write_file = setup.store.write_file

    def recorded(file: FileObject, owner: str, data: bytes) -> StoredFile:
        threads.append(threading.get_ident())
        return write_file(file, owner, data)

    monkeypatch.setattr(setup.store, "write_file", recorded)
    file = upload(setup.shelf, "alice", _input(1))
    assert threads and threads[0] != threading.get_ident()
    assert setup.shelf.get("alice", file.id) == file


def test_a_batch_s_file_is_read_and_checked_off_the_event_loop(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []
    content = setup.store.content

    def recorded(file_id: str) -> bytes:
        threads.append(threading.get_ident())
        return content(file_id)

    file = upload(setup.shelf, "alice", _input(3))
    monkeypatch.setattr(setup.store, "content", recorded)
    batch = asyncio.run(setup.book.create(Caller(ALICE, "k1"), file.id, CHAT, "24h", None))
    assert threads and threads[0] != threading.get_ident()
    assert batch.status == "in_progress" and batch.request_counts.total == 3


def test_the_results_files_are_fsynced_before_the_batch_ends(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = setup.start(2)
    synced: list[str] = []
    fsync = os.fsync

    def recorded(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recorded)
    for status in (200, 500):
        job = setup.book.take()
        assert job is not None
        setup.book.record(*job, status, "rid", ANSWER)
    stored = setup.store.batches[batch_id]
    results = [f"{stored.output_id}.jsonl", f"{stored.error_id}.jsonl"]
    assert all(name in synced for name in results)
    # `completed` is written after them (its temp file named by the writing store's tag)
    assert synced[-1].startswith(f".{batch_id}.json.") and synced[-1].endswith(".tmp")


@pytest.mark.parametrize(("owner", "key_id"), [(ANONYMOUS, ""), (ALICE, "k-removed")])
def test_with_auth_on_a_batch_whose_key_is_not_configured_has_no_caller(
    tmp_path: Path, owner: Tenant, key_id: str
) -> None:
    clock = Clock(1_000_000.0)
    first = Setup(tmp_path, clock, tenants={**TENANTS, ANONYMOUS.name: ANONYMOUS})
    file = upload(first.shelf, owner.name, _input(1))  # made with auth off, or a key since gone
    asyncio.run(first.book.create(Caller(owner, key_id), file.id, CHAT, "24h", None))
    second = Setup(tmp_path, clock, tenants={**TENANTS, ANONYMOUS.name: ANONYMOUS},
                   keys=frozenset({("alice", "k1")}))  # fmt: skip
    job = second.book.take()
    assert job is not None and second.book.caller(job[0]) is None
    mine = Setup(tmp_path / "other", clock, keys=frozenset({("alice", "k1")}))
    mine.start(1)  # alice's key k1 is configured: hers runs
    kept = mine.book.take()
    assert kept is not None and mine.book.caller(kept[0]) == Caller(ALICE, "k1")
