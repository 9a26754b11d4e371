"""What a batch directory holds now, object by object: what a store reads at start, and what
a store sharing the directory with other gateways reads again to see their writes
(store.py's `refresh`). Only what changed since the last look is read: an object's file is
known by its signature (inode, modification time, size), and every write of one is a rename
onto its name, which gives it a new inode.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import msgspec

from fleetgate.batches.ids import valid_id
from fleetgate.batches.objects import StoredBatch, StoredFile

log = logging.getLogger(__name__)

Signature = tuple[int, int, int]  # inode, mtime in ns, size
Key = tuple[str, str]  # ("files" or "batches", the object's id)
_T = TypeVar("_T")


def signature(stat: os.stat_result) -> Signature:
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


@dataclass(slots=True)
class Scan:
    present: dict[Key, Signature] = field(default_factory=dict)  # every object's file
    # Those new or changed since the last look, by id, read (None: unreadable, left out).
    files: dict[str, StoredFile | None] = field(default_factory=dict)
    batches: dict[str, StoredBatch | None] = field(default_factory=dict)
    cancels: frozenset[str] = frozenset()  # batches a gateway asked to cancel


def scan(root: Path, seen: Mapping[Key, Signature]) -> Scan:
    """Every object under `root`; those whose signature is not the one in `seen`, read. It
    reads only: it may run in a thread. A stat per object, and no more for one unchanged."""
    found = Scan()
    cancels: set[str] = set()
    for kind in ("files", "batches"):
        try:
            entries = list(os.scandir(root / kind))
        except FileNotFoundError:
            continue
        for entry in entries:
            stem, _, suffix = entry.name.partition(".")
            if suffix == "cancel" and valid_id(stem):
                cancels.add(stem)
            if suffix != "json" or not valid_id(stem):
                continue
            try:
                sig = signature(entry.stat())
            except FileNotFoundError:  # deleted meanwhile
                continue
            key = (kind, stem)
            found.present[key] = sig
            if seen.get(key) == sig:
                continue
            if kind == "files":
                found.files[stem] = _read(Path(entry.path), StoredFile)
            else:
                found.batches[stem] = _read(Path(entry.path), StoredBatch)
    found.cancels = frozenset(cancels)
    return found


def _read(path: Path, kind: type[_T]) -> _T | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except (OSError, msgspec.DecodeError) as exc:
        log.warning("batches: cannot read %s, left out: %s", path, exc)
        return None
