"""Files of the Batch API: uploads (purpose `batch`), and the output and error files batches
write; each its owner's alone, within the `batches:` bounds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from fleetgate.batches.ids import valid_id
from fleetgate.batches.objects import FileObject
from fleetgate.batches.pages import page
from fleetgate.batches.settings import BatchesSettings
from fleetgate.batches.store import BatchStore
from fleetgate.traffic.door import Refused

MAX_FILENAME = 255  # characters kept of an upload's name


class FileShelf:
    """Uploads, listing, content and deletion of files, for their owners only."""

    def __init__(
        self, store: BatchStore, settings: BatchesSettings, wall_clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._settings = settings
        self._clock = wall_clock

    async def upload(self, owner: str, filename: str, purpose: str, data: bytes) -> FileObject:
        """Keep an upload; `Refused` (400, 413) when it may not be kept, saying why. It is
        written (and fsynced) in a thread, off the event loop."""
        if purpose != "batch":
            raise Refused(
                400, f"`purpose` {purpose[:40]!r} is not accepted here: this gateway keeps "
                "files for the Batch API only; send `purpose=batch`.", "invalid_value",
                param="purpose",
            )  # fmt: skip
        if not data:
            raise Refused(400, "The file is empty: send a JSONL file of requests.",
                          "invalid_value", param="file")  # fmt: skip
        settings, store = self._settings, self._store
        kept = sum(1 for f in store.files.values() if f.owner == owner)
        if kept >= settings.max_files_per_tenant:
            raise Refused(
                400, f"You keep {kept} files, the most allowed here "
                "(`batches.max_files_per_tenant`); delete some (DELETE /v1/files/{id}).",
                "too_many_files",
            )  # fmt: skip
        if store.stored_bytes + len(data) > settings.max_files_bytes:
            raise Refused(
                413, "The gateway's file storage is full (`batches.max_files_bytes`); delete "
                "files you no longer need (DELETE /v1/files/{id}) or ask its operator for more.",
                "storage_full",
            )  # fmt: skip
        now = int(self._clock())
        file = FileObject(
            id=store.new_id("file-"), bytes=len(data), created_at=now,
            filename=_clean(filename), purpose="batch",
            expires_at=now + int(settings.retention_s),
        )  # fmt: skip
        store.stored_bytes += len(data)  # held while it is written: uploads meanwhile see it
        try:
            stored = await asyncio.to_thread(store.write_file, file, owner, data)
        finally:
            store.stored_bytes -= len(data)
        store.add(stored)
        return file

    def get(self, owner: str, file_id: str) -> FileObject:
        stored = self._store.files.get(file_id) if valid_id(file_id) else None
        if stored is None or stored.owner != owner:  # another's is not found either
            raise Refused(404, f"No such file: {file_id[:80]!r}.", "not_found")
        return stored.file

    def content_path(self, owner: str, file_id: str) -> Path:
        """Where the owner's file's content is (to be read off the event loop)."""
        return self._store.content_path(self.get(owner, file_id).id)

    def delete(self, owner: str, file_id: str) -> None:
        """Delete a file; a batch running from it keeps its requests (store.py)."""
        self._store.delete_file(self.get(owner, file_id).id)

    def listing(
        self, owner: str, purpose: str | None, limit: int, after: str | None, newest_first: bool
    ) -> tuple[list[FileObject], bool]:
        """The owner's files (of one purpose), from the one after `after`; and whether more
        follow."""
        mine = [
            s.file
            for s in self._store.files.values()
            if s.owner == owner and (purpose is None or s.file.purpose == purpose)
        ]
        mine.sort(key=lambda f: (f.created_at, f.id), reverse=newest_first)
        return page(mine, lambda f: f.id, limit, after)


def _clean(filename: str) -> str:
    """An upload's name as it is shown back: its last path part, printable, bounded. (Never
    used to name anything on disk.)"""
    name = filename.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if c.isprintable())[:MAX_FILENAME]
    return name or "upload.jsonl"
