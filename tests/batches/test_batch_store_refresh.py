"""Two stores on one directory, as two gateways sharing it (store.py's `refresh`): each sees
what the other wrote, changed and deleted, and the cancels it asked; never replaces a batch it
runs itself, nor its own write made while it was reading; and agrees with a fresh load on the
bytes stored."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

import fleetgate.batches.store as store_module
from fleetgate.batches.objects import Batch, StoredBatch
from fleetgate.batches.scan import Key, Scan, Signature, scan
from fleetgate.batches.store import BatchStore
from tests.batches.test_batch_store import _file


def _store(root: Path, seed: int) -> BatchStore:
    store = BatchStore(root, random.Random(seed))
    store.load()
    return store


def _batch(store: BatchStore, status: str = "in_progress") -> StoredBatch:
    batch = Batch(
        id=store.new_id("batch_"), endpoint="/v1/chat/completions", input_file_id="file-x",
        completion_window="24h", status=status, created_at=1,
    )  # fmt: skip
    stored = StoredBatch(batch=batch, owner="alice", key_id="", output_id="file-o",
                         error_id="file-e")  # fmt: skip
    store.save_batch(stored)
    return stored


async def test_a_store_sees_what_another_wrote_changed_and_deleted(tmp_path: Path) -> None:
    a, b = _store(tmp_path, 1), _store(tmp_path, 2)
    file = _file(a, b"12345\n")
    stored = _batch(a)
    await b.refresh(())
    assert b.files[file.id].file == file and b.batches[stored.batch.id] == stored
    assert b.stored_bytes == a.stored_bytes == 6
    stored.batch.status = "completed"
    a.save_batch(stored)
    await b.refresh(())
    assert b.batches[stored.batch.id].batch.status == "completed"
    a.delete_file(file.id)
    a.delete_batch(stored.batch.id)
    await b.refresh(())
    assert not b.files and not b.batches and b.stored_bytes == 0


async def test_a_batch_it_runs_is_never_replaced_by_what_is_on_disk(tmp_path: Path) -> None:
    a, b = _store(tmp_path, 1), _store(tmp_path, 2)
    stored = _batch(a)
    await b.refresh(())
    mine = b.batches[stored.batch.id]
    stored.batch.status = "cancelling"  # another's write: never made in practice, but seen
    a.save_batch(stored)
    await b.refresh([stored.batch.id])
    assert b.batches[stored.batch.id] is mine
    a.delete_batch(stored.batch.id)
    await b.refresh([stored.batch.id])
    assert b.batches[stored.batch.id] is mine


async def test_its_own_write_made_while_it_read_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _store(tmp_path, 1), _store(tmp_path, 2)
    stored = _batch(a)
    await b.refresh(())
    theirs = b.batches[stored.batch.id]
    mine = msgspec.structs.replace(theirs, batch=msgspec.structs.replace(theirs.batch))

    def scan_then_write(root: Path, seen: dict[Key, Signature]) -> Scan:
        found = scan(root, dict.fromkeys(seen, (0, 0, 0)))  # reads every object again
        mine.batch.status = "cancelling"
        b.save_batch(mine)  # written by b while its scan was under way (the old one read)
        return found

    monkeypatch.setattr(store_module, "scan", scan_then_write)
    await b.refresh(())
    assert b.batches[stored.batch.id] is mine and mine.batch.status == "cancelling"


async def test_cancels_asked_are_seen_until_the_batch_ends(tmp_path: Path) -> None:
    a, b = _store(tmp_path, 1), _store(tmp_path, 2)
    stored = _batch(a)
    b.ask_cancel(stored.batch.id)
    await a.refresh(())
    assert a.cancels == {stored.batch.id}
    a.delete_input(stored.batch.id)  # what the end of a batch deletes
    await a.refresh(())
    assert not a.cancels


async def test_the_directory_has_one_id_for_every_store(tmp_path: Path) -> None:
    a, b = _store(tmp_path / "d", 1), _store(tmp_path / "d", 2)
    first = a.directory_id
    assert first.startswith("dir_") and b.directory_id == first
    assert _store(tmp_path / "other", 3).directory_id != first
    assert not list((tmp_path / "d").glob(".id.*"))  # no temp left behind


async def test_an_upload_deleted_at_another_gateway_goes_at_the_next_look(tmp_path: Path) -> None:
    a, b = _store(tmp_path, 1), _store(tmp_path, 2)
    file = _file(a, b"12345678\n")  # before a has looked again
    await b.refresh(())
    b.delete_file(file.id)
    await a.refresh(())
    assert file.id not in a.files and a.stored_bytes == 0


async def test_an_unreadable_object_is_read_again_at_the_next_look(tmp_path: Path) -> None:
    a, b = _store(tmp_path, 1), _store(tmp_path, 2)
    stored = _batch(a)
    path = tmp_path / "batches" / f"{stored.batch.id}.json"
    good = path.read_bytes()
    path.write_bytes(b"{half")  # as a volume without atomic renames may show it
    await b.refresh(())
    assert stored.batch.id not in b.batches
    path.write_bytes(good)
    await b.refresh(())
    assert b.batches[stored.batch.id] == stored
