"""The Batch API's store on disk: objects written whole and read back by a new store, result
lines appended with a crash's half line dropped, ids checked before any path is built."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from fleetgate.batches.ids import valid_id
from fleetgate.batches.objects import FileObject
from fleetgate.batches.store import LEFTOVER_S, BatchStore

SEED = 7


class Clock:
    """A wall clock a test moves by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _file(store: BatchStore, data: bytes = b"x\n") -> FileObject:
    file = FileObject(id=store.new_id("file-"), bytes=len(data), created_at=1,
                      filename="a.jsonl", purpose="batch")  # fmt: skip
    store.add(store.write_file(file, "alice", data))
    return file


def test_a_new_store_reads_back_what_was_written(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, random.Random(SEED))
    store.load()  # nothing there yet: nothing made either
    assert not tmp_path.joinpath("files").exists()
    file = _file(store, b"hello\n")
    again = BatchStore(tmp_path, random.Random(SEED))
    again.load()
    assert again.files[file.id].file == file and again.files[file.id].owner == "alice"
    assert again.content(file.id) == b"hello\n" and again.stored_bytes == 6
    assert not list(tmp_path.rglob(".*.tmp"))


def test_ids_are_random_and_never_reused_from_the_same_seed(tmp_path: Path) -> None:
    first = _file(BatchStore(tmp_path, random.Random(SEED)))
    second = BatchStore(tmp_path, random.Random(SEED))  # a restart drawing the same sequence
    second.load()
    assert second.new_id("file-") != first.id
    assert valid_id(first.id) and first.id.startswith("file-") and len(first.id) == 29


@pytest.mark.parametrize("text", ["", "../etc", "a/b", "a.b", "a" * 65, "é", "a%2Fb", "a\x00"])
def test_anything_but_a_plain_id_is_refused_before_it_names_a_path(
    tmp_path: Path, text: str
) -> None:
    assert not valid_id(text)
    with pytest.raises(ValueError, match="not an id"):
        BatchStore(tmp_path, random.Random(SEED)).content(text)


def test_a_half_written_last_line_is_dropped_from_the_file(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, random.Random(SEED))
    store.append("file-out", b'{"a":1}')
    with (tmp_path / "files" / "file-out.jsonl").open("ab") as out:
        out.write(b'{"a":')
    assert store.lines("file-out") == [b'{"a":1}']
    assert store.content("file-out") == b'{"a":1}\n'
    store.append("file-out", b'{"a":2}')
    assert store.lines("file-out") == [b'{"a":1}', b'{"a":2}']


def test_an_unreadable_object_is_left_out_not_fatal(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, random.Random(SEED))
    good = _file(store)
    (tmp_path / "files" / "file-broken.json").write_bytes(b"{not json")
    cut_short = tmp_path / "files" / ".file-x.json.a1.tmp"
    cut_short.write_bytes(b"half")
    under_way = tmp_path / "files" / ".file-y.json.b2.tmp"  # another gateway's, being written
    under_way.write_bytes(b"half")
    now = cut_short.stat().st_mtime
    os.utime(cut_short, (now - LEFTOVER_S - 1, now - LEFTOVER_S - 1))
    again = BatchStore(tmp_path, random.Random(SEED), Clock(now))
    again.load()
    assert list(again.files) == [good.id]
    assert not cut_short.exists()
    assert under_way.exists()


def test_a_batch_keeps_its_input_when_the_file_is_deleted(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, random.Random(SEED))
    file = _file(store, b"requests\n")
    store.keep_input("batch_1", file.id)
    store.delete_file(file.id)
    assert store.input_of("batch_1") == b"requests\n"
    assert store.stored_bytes == 0 and file.id not in store.files
