"""A file of backends, read again when it changes (its size, modification time or inode):

    backends:
      - {model: llama-3-8b, url: "http://10.0.0.5:8000", labels: {zone: a}}
      - {model: llama-3-8b, url: "http://10.0.0.6:8000", ready: false}

YAML or JSON (JSON is YAML). A file that cannot be read, does not parse, or is empty (a
writer caught halfway: write a new file and rename it over the old one) is a SourceError, so
the last good set stays; `backends: []` is an answer, and empties what this file added.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

import msgspec
import yaml

from fleetgate.discovery.found import Found, SourceError
from fleetgate.settings import Settings

MAX_BYTES = 16 * 1024 * 1024  # a larger file is refused unread


def stamp(path: str | Path) -> tuple[int, int, int]:
    """What changes when a file is written or replaced (renamed over, or swapped through a
    symbolic link as a mounted ConfigMap is: the stat follows links): its inode, size and
    modification time. OSError when it cannot be looked at."""
    stat = os.stat(path)
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


class _File(Settings, frozen=True):
    backends: list[Found]


class FileSource:
    """The backends listed in `path`, stat'ed every `interval_s` and read when it changed."""

    def __init__(self, path: Path, interval_s: float) -> None:
        self._path = path
        self._interval_s = interval_s
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime ns) last read
        self._found: list[Found] = []

    @property
    def name(self) -> str:
        return f"file:{self._path}"

    @property
    def interval_s(self) -> float:
        return self._interval_s

    async def read(self) -> Sequence[Found]:
        try:
            seen = stamp(self._path)
        except OSError as exc:
            raise SourceError(f"cannot read {self._path}: {exc.strerror}") from None
        if seen != self._seen:
            self._found = await asyncio.get_running_loop().run_in_executor(None, self._parse)
            self._seen = seen
        return self._found

    async def close(self) -> None:
        pass  # holds nothing open between reads

    def _parse(self) -> list[Found]:
        path = self._path
        try:
            with path.open("rb") as f:
                text = f.read(MAX_BYTES + 1)
        except OSError as exc:
            raise SourceError(f"cannot read {path}: {exc.strerror}") from None
        if len(text) > MAX_BYTES:
            raise SourceError(f"{path} is over {MAX_BYTES} bytes")
        if not text.strip():
            raise SourceError(f"{path} is empty (write a new file and rename it over the old)")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SourceError(f"{path} is not valid YAML: {exc}") from None
        try:
            return msgspec.convert(data, _File).backends
        except msgspec.ValidationError as exc:
            message = str(exc).replace("Object contains", "Unknown key:")
            raise SourceError(f"{path}: {message}") from None
