"""The Batch API's state on disk, under one directory:

    files/<id>.json            a file's object and owner
    files/<id>.jsonl           its content; an output or error file's grows a line per result
    batches/<id>.json          a batch's object, owner, and the ids of its files
    batches/<id>.input.jsonl   its requests: a hard link to (or a copy of) its input file, so
                               deleting the input file cannot take them from a running batch;
                               deleted when the batch ends

Objects are written whole (a temp file, fsync, then rename), result lines appended one write
each (fsynced once, when their batch ends), so a crash leaves at most a half-written last line
(`lines` drops it). Ids are drawn here from the injected random source, and a path is only
ever built from an id that `valid_id` passed. The directory is made at the first write, not
before. One gateway per directory: two would run the same batches.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import string
from pathlib import Path
from typing import TypeVar

import msgspec

from fleetgate.batches.objects import FileObject, StoredBatch, StoredFile

log = logging.getLogger(__name__)

_ID_CHARS = frozenset(string.ascii_letters + string.digits + "_-")
_ALPHABET = string.ascii_letters + string.digits
_RANDOM_CHARS = 24  # 62**24: about 143 bits
_T = TypeVar("_T")


def draw_id(rng: random.Random, prefix: str) -> str:
    """`prefix` and 24 random letters and digits."""
    return prefix + "".join(rng.choices(_ALPHABET, k=_RANDOM_CHARS))


def valid_id(text: str) -> bool:
    """Whether `text` may name a file or batch: 1 to 64 of [A-Za-z0-9_-]."""
    return 0 < len(text) <= 64 and _ID_CHARS.issuperset(text)


class BatchStore:
    """Files and batches kept under `root`, with the objects of all of them in memory."""

    def __init__(self, root: Path, rng: random.Random) -> None:
        self.root = root
        self._rng = rng
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, StoredBatch] = {}
        # Of the files kept, result files counted as their lines are written (before they are
        # published): what bounds the disk (`max_files_bytes`).
        self.stored_bytes = 0
        self._growing: dict[str, int] = {}  # bytes of the result files not yet published

    def load(self) -> None:
        """Read every object under `root` (none when it does not exist yet); one that cannot be
        read is logged and left out, never fatal."""
        for path in self._objects("files"):
            stored = _read(path, StoredFile)
            if stored is not None and stored.file.id == path.stem:
                self.files[stored.file.id] = stored
                self.stored_bytes += stored.file.bytes
        for path in self._objects("batches"):
            batch = _read(path, StoredBatch)
            if batch is not None and batch.batch.id == path.stem:
                self.batches[batch.batch.id] = batch

    def random_id(self, prefix: str) -> str:
        """An id for what is never looked up by it (a result line's)."""
        return draw_id(self._rng, prefix)

    def new_id(self, prefix: str) -> str:
        """A fresh id: `prefix` and 24 random letters and digits, unused here."""
        while True:
            new = draw_id(self._rng, prefix)
            if new not in self.files and new not in self.batches and not self._taken(new):
                return new

    def _taken(self, new: str) -> bool:
        return any(
            self._path(kind, new, suffix).exists()
            for kind, suffix in (("files", ".json"), ("files", ".jsonl"), ("batches", ".json"))
        )

    # Files.

    def write_file(self, file: FileObject, owner: str, data: bytes) -> StoredFile:
        """Write an upload to disk, its content first, then its object; touches nothing in
        memory, so it may run in a thread (it fsyncs). `add` then makes it seen."""
        _write_whole(self._path("files", file.id, ".jsonl"), data)
        stored = StoredFile(file=file, owner=owner)
        _write_whole(self._path("files", file.id, ".json"), msgspec.json.encode(stored))
        return stored

    def add(self, stored: StoredFile) -> None:
        self.stored_bytes += stored.file.bytes
        self.files[stored.file.id] = stored

    def publish(self, file: FileObject, owner: str) -> StoredFile:
        """Write a file's object (for an output file: its content is already appended)."""
        stored = StoredFile(file=file, owner=owner)
        _write_whole(self._path("files", file.id, ".json"), msgspec.json.encode(stored))
        old = self.files.get(file.id)
        counted = old.file.bytes if old is not None else self._growing.pop(file.id, 0)
        self.stored_bytes += file.bytes - counted
        self.files[file.id] = stored
        return stored

    def content(self, file_id: str) -> bytes:
        return self.content_path(file_id).read_bytes()

    def content_path(self, file_id: str) -> Path:
        return self._path("files", file_id, ".jsonl")

    def delete_file(self, file_id: str) -> None:
        stored = self.files.pop(file_id, None)
        if stored is not None:
            self.stored_bytes -= stored.file.bytes
        self.stored_bytes -= self._growing.pop(file_id, 0)
        for suffix in (".json", ".jsonl"):  # the object first: a file half gone is not seen
            self._path("files", file_id, suffix).unlink(missing_ok=True)

    # Result lines of an output or error file.

    def append(self, file_id: str, *lines: bytes) -> None:
        """Add result lines to a results file, in one write."""
        path = self._path("files", file_id, ".jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        data = b"".join(line + b"\n" for line in lines)
        with path.open("ab", buffering=0) as out:  # unbuffered: each write(2) seen here
            end = out.tell()
            left = memoryview(data)
            try:
                while left:
                    left = left[out.write(left) or 0 :]
            except OSError:  # a full disk: no half line left for the next one to follow
                out.truncate(end)
                raise
        self._count(file_id, end + len(data))

    def lines(self, file_id: str) -> list[bytes]:
        """The complete lines of a results file; a last line cut by a crash is removed from the
        file (its request is run again)."""
        path = self._path("files", file_id, ".jsonl")
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        whole = data.rfind(b"\n") + 1
        if whole < len(data):
            log.warning("batches: dropping a half-written line at the end of %s", path)
            with path.open("r+b") as out:
                out.truncate(whole)
        self._count(file_id, whole)
        return data[:whole].splitlines()

    def sync(self, file_id: str) -> None:
        """Make a results file's lines durable (before the object saying they are all there)."""
        with self._path("files", file_id, ".jsonl").open("rb") as lines:
            os.fsync(lines.fileno())

    def _count(self, file_id: str, size: int) -> None:
        """A result file not yet published is `size` bytes now."""
        if file_id not in self.files:
            self.stored_bytes += size - self._growing.get(file_id, 0)
            self._growing[file_id] = size

    def size(self, file_id: str) -> int:
        try:
            return self._path("files", file_id, ".jsonl").stat().st_size
        except FileNotFoundError:
            return 0

    # Batches.

    def save_batch(self, stored: StoredBatch) -> None:
        _write_whole(self._path("batches", stored.batch.id, ".json"), msgspec.json.encode(stored))
        self.batches[stored.batch.id] = stored

    def keep_input(self, batch_id: str, file_id: str) -> None:
        """The batch's own hold on its input file's content."""
        source = self._path("files", file_id, ".jsonl")
        target = self._path("batches", batch_id, ".input.jsonl")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        try:
            os.link(source, target)
        except OSError:  # no hard links here (another file system, or none on this one)
            shutil.copyfile(source, target)

    def input_of(self, batch_id: str) -> bytes:
        return self._path("batches", batch_id, ".input.jsonl").read_bytes()

    def delete_input(self, batch_id: str) -> None:
        """A batch that has ended needs its requests no more."""
        self._path("batches", batch_id, ".input.jsonl").unlink(missing_ok=True)

    def delete_batch(self, batch_id: str) -> None:
        self.batches.pop(batch_id, None)
        for suffix in (".json", ".input.jsonl"):
            self._path("batches", batch_id, suffix).unlink(missing_ok=True)

    def _path(self, kind: str, item_id: str, suffix: str) -> Path:
        if not valid_id(item_id):  # never reached with a client's string: callers check first
            raise ValueError(f"not an id: {item_id[:80]!r}")
        return self.root / kind / (item_id + suffix)

    def _objects(self, kind: str) -> list[Path]:
        folder = self.root / kind
        if not folder.is_dir():
            return []
        for leftover in folder.glob(".*.tmp"):  # a write that a crash cut short
            leftover.unlink(missing_ok=True)
        return sorted(p for p in folder.glob("*.json") if valid_id(p.stem))


def _write_whole(path: Path, data: bytes) -> None:
    """Replace `path` with `data` at once: readers (and a restart) see the old or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    with temp.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temp, path)


def _read(path: Path, kind: type[_T]) -> _T | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except (OSError, msgspec.DecodeError) as exc:
        log.warning("batches: cannot read %s, left out: %s", path, exc)
        return None
