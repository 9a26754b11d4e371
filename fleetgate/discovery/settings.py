"""The config's `discovery:` list: each entry a source, named by its `type`."""

from __future__ import annotations

from fleetgate.settings import Settings, positive_seconds


class FileDiscovery(Settings, frozen=True, tag="file", tag_field="type"):
    """A file of backends (discovery/file_source.py), read again when it changes."""

    path: str
    interval_s: float = 1.0  # how often the file is checked for a change

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("`path` is empty: give the file of backends")
        positive_seconds("interval_s", self.interval_s)


SourceConfig = FileDiscovery
"""Any source's config (a union of them as more kinds come)."""
