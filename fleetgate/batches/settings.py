"""The `batches:` section: where the Batch API keeps its state, and what bounds it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from fleetgate.settings import Settings, at_least, positive_seconds


class BatchesSettings(Settings, frozen=True):
    """The `batches:` section (docs/batches.md)."""

    enabled: bool = True  # serve /v1/files and /v1/batches, and run batches
    # Files and batches live here; None: $XDG_DATA_HOME/fleetgate/batches, or
    # ~/.local/share/fleetgate/batches without it. Made at the first upload.
    dir: str | None = None
    concurrency: int = 4  # batch requests in flight at most, all batches together
    max_requests: int = 50_000  # lines of one batch's input file at most
    max_files_bytes: int = 10 * 1024**3  # bytes of all files stored (outputs included)
    max_files_per_tenant: int = 1000  # files one tenant may keep (outputs included)
    max_batches_per_tenant: int = 1000  # batches one tenant may keep, any status
    # Batches running (not yet ended) at once: each holds its requests' bodies in memory (up
    # to `server.max_body_bytes`) and a copy of its input file on disk.
    max_running_batches_per_tenant: int = 16
    max_running_batches: int = 256  # all tenants together
    # Finished batches, and every file, are deleted this long after they end or were made.
    retention_s: float = 30 * 86400.0
    # Gateways sharing the directory (`state.url`): one runs the batches while it holds a
    # lease of this long, renewed every second; if it dies, another takes them over after it.
    lease_s: float = 10.0

    def __post_init__(self) -> None:
        if self.dir is not None and not self.dir:
            raise ValueError("`dir` must be a directory's path, or absent for the default")
        at_least("concurrency", self.concurrency, 1)
        at_least("max_requests", self.max_requests, 1)
        at_least("max_files_bytes", self.max_files_bytes, 1)
        at_least("max_files_per_tenant", self.max_files_per_tenant, 1)
        at_least("max_batches_per_tenant", self.max_batches_per_tenant, 1)
        at_least("max_running_batches_per_tenant", self.max_running_batches_per_tenant, 1)
        at_least("max_running_batches", self.max_running_batches, 1)
        positive_seconds("retention_s", self.retention_s)
        if self.lease_s < 2.0:  # renewed within half a second, four times a lease at least
            raise ValueError(f"`lease_s` must be at least 2 seconds, not {self.lease_s:g}")

    def directory(self, environ: Mapping[str, str] = os.environ) -> Path:
        """Where the state lives: `dir`, else under the XDG data directory."""
        if self.dir is not None:
            return Path(self.dir).expanduser()
        base = environ.get("XDG_DATA_HOME") or str(Path(environ.get("HOME", "~")) / ".local/share")
        return Path(base).expanduser() / "fleetgate" / "batches"
