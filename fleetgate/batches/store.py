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
before.

Several gateways may share one directory (a shared volume; `state.url` set): each keeps the
objects in memory and `refresh` reads what the others wrote since (scan.py); one of them at a
time runs the batches (sharing.py), and the others ask it to cancel one by a marker file,
`batches/<id>.cancel`. Each gateway writes its temp files under names of its own.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Collection
from pathlib import Path

import msgspec

from fleetgate.batches.ids import draw_id, valid_id
from fleetgate.batches.objects import FileObject, StoredBatch, StoredFile
from fleetgate.batches.scan import Key, Scan, Signature, scan, signature

log = logging.getLogger(__name__)

LEFTOVER_S = 600.0  # a temp file this old is a write a crash cut short (a live one lasts ms)


class BatchStore:
    """Files and batches kept under `root`, with the objects of all of them in memory."""

    def __init__(
        self, root: Path, rng: random.Random, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.root = root
        self._rng = rng
        self._clock = wall_clock
        self._tag = draw_id(rng, "")[:12]  # in this store's temp files' names
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, StoredBatch] = {}
        # Of the files kept, result files counted as their lines are written (before they are
        # published): what bounds the disk (`max_files_bytes`).
        self.stored_bytes = 0
        self._growing: dict[str, int] = {}  # bytes of the result files not yet published
        self._seen: dict[Key, Signature] = {}  # each object's file as last read or written
        self.cancels: frozenset[str] = frozenset()  # batches another gateway asked to cancel
        self.writes = 0  # changes this store made to the directory (shared: told the others)

    def load(self) -> None:
        """Read every object under `root` (none when it does not exist yet); one that cannot be
        read is logged and left out, never fatal."""
        for kind in ("files", "batches"):
            _clean(self.root / kind, self._clock() - LEFTOVER_S)
        self._apply(scan(self.root, {}), {}, ())

    async def refresh(self, keep: Collection[str]) -> None:
        """Read what other gateways sharing the directory wrote, or deleted, since the last
        look: read in a thread, then applied here, except the batches in `keep` (those this
        gateway runs: it alone writes them)."""
        seen = dict(self._seen)
        found = await asyncio.to_thread(scan, self.root, seen)
        self._apply(found, seen, keep)

    def _apply(self, found: Scan, seen: dict[Key, Signature], keep: Collection[str]) -> None:
        """What the scan found, where this store has not itself written it since `seen`."""
        self.cancels = found.cancels
        # One unreadable (being replaced on a volume without atomic renames) is read again next.
        for file_id, stored_file in found.files.items():
            key = ("files", file_id)
            if self._seen.get(key) == seen.get(key) and stored_file is not None:
                self._seen[key] = found.present[key]
                if stored_file.file.id == file_id:
                    self._put_file(stored_file)
        for batch_id, stored in found.batches.items():
            key = ("batches", batch_id)
            if batch_id in keep or stored is None or self._seen.get(key) != seen.get(key):
                continue
            self._seen[key] = found.present[key]
            if stored.batch.id == batch_id:
                self.batches[batch_id] = stored
        for key, sig in seen.items():
            if key not in found.present and self._seen.get(key) == sig:  # deleted by another
                del self._seen[key]
                kind, item_id = key
                if kind == "files":
                    self._drop_file(item_id)
                elif item_id not in keep:
                    self.batches.pop(item_id, None)

    def _put_file(self, stored: StoredFile) -> None:
        old = self.files.get(stored.file.id)
        counted = old.file.bytes if old is not None else self._growing.pop(stored.file.id, 0)
        self.stored_bytes += stored.file.bytes - counted
        self.files[stored.file.id] = stored

    def _drop_file(self, file_id: str) -> None:
        stored = self.files.pop(file_id, None)
        if stored is not None:
            self.stored_bytes -= stored.file.bytes
        self.stored_bytes -= self._growing.pop(file_id, 0)

    def _write_object(self, key: Key, data: bytes, durable: bool = True) -> None:
        """An object written whole, and known as this store's own write (not read back)."""
        path = self._path(*key, ".json")
        _write_whole(path, data, self._tag, durable)
        self._seen[key] = signature(path.stat())
        self.writes += 1

    @functools.cached_property
    def directory_id(self) -> str:
        """The directory's own id, the same for every gateway that shares it (read once): made
        by the first to ask (a link, which never replaces one another made meanwhile)."""
        path = self.root / ".id"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        self.root.mkdir(parents=True, exist_ok=True)
        temp = self.root / f".id.{self._tag}.tmp"
        temp.write_text(draw_id(self._rng, "dir_"))
        try:
            os.link(temp, path)
        except FileExistsError:
            pass
        finally:
            temp.unlink(missing_ok=True)
        return path.read_text().strip()

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
        _write_whole(self._path("files", file.id, ".jsonl"), data, self._tag)
        stored = StoredFile(file=file, owner=owner)
        _write_whole(self._path("files", file.id, ".json"), msgspec.json.encode(stored), self._tag)
        return stored

    def add(self, stored: StoredFile) -> None:
        """An upload `write_file` wrote, seen from now on (unless deleted meanwhile: shared,
        another gateway may have)."""
        key = ("files", stored.file.id)
        self.writes += 1
        try:
            self._seen[key] = signature(self._path(*key, ".json").stat())
        except FileNotFoundError:
            return
        self._put_file(stored)

    def publish(self, file: FileObject, owner: str) -> StoredFile:
        """Write a file's object (for an output file: its content is already appended)."""
        stored = StoredFile(file=file, owner=owner)
        self._write_object(("files", file.id), msgspec.json.encode(stored))
        self._put_file(stored)
        return stored

    def content(self, file_id: str) -> bytes:
        return self.content_path(file_id).read_bytes()

    def content_path(self, file_id: str) -> Path:
        return self._path("files", file_id, ".jsonl")

    def delete_file(self, file_id: str) -> None:
        self.writes += 1
        self._drop_file(file_id)
        self._seen.pop(("files", file_id), None)
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

    def save_batch(self, stored: StoredBatch, durable: bool = True) -> None:
        """Write a batch's object; not `durable`: not fsynced (its counts while it runs, which
        a restart reads back from its results files anyway)."""
        self._write_object(("batches", stored.batch.id), msgspec.json.encode(stored), durable)
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
        """A batch that has ended needs its requests (and a cancel asked) no more."""
        self.writes += 1
        for suffix in (".input.jsonl", ".cancel"):
            self._path("batches", batch_id, suffix).unlink(missing_ok=True)

    def delete_batch(self, batch_id: str) -> None:
        self.writes += 1
        self.batches.pop(batch_id, None)
        self._seen.pop(("batches", batch_id), None)
        for suffix in (".json", ".input.jsonl", ".cancel"):
            self._path("batches", batch_id, suffix).unlink(missing_ok=True)

    def ask_cancel(self, batch_id: str) -> None:
        """Ask the gateway that runs the batch to cancel it (the marker goes with the batch)."""
        path = self._path("batches", batch_id, ".cancel")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        self.writes += 1
        self.cancels |= {batch_id}

    def _path(self, kind: str, item_id: str, suffix: str) -> Path:
        if not valid_id(item_id):  # never reached with a client's string: callers check first
            raise ValueError(f"not an id: {item_id[:80]!r}")
        return self.root / kind / (item_id + suffix)


def _clean(folder: Path, before: float) -> None:
    """Delete the temp files in `folder` last written before `before` (wall time): writes a
    crash cut short, never another gateway's write under way."""
    if not folder.is_dir():
        return
    for leftover in folder.glob(".*.tmp"):
        try:
            if leftover.stat().st_mtime < before:
                leftover.unlink(missing_ok=True)
        except FileNotFoundError:
            pass


def _write_whole(path: Path, data: bytes, tag: str, durable: bool = True) -> None:
    """Replace `path` with `data` at once: readers (and a restart) see the old or the new
    (after a power cut too, when `durable`). Its temp file is named by the writer's `tag`:
    two gateways writing one name at once never write into each other's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{tag}.tmp")
    with temp.open("wb") as out:
        out.write(data)
        out.flush()
        if durable:
            os.fsync(out.fileno())
    os.replace(temp, path)
