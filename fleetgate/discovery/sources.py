"""Each source's config made into the source that reads it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fleetgate.discovery.file_source import FileSource
from fleetgate.discovery.found import Source
from fleetgate.discovery.settings import SourceConfig


def build_sources(configs: Sequence[SourceConfig]) -> list[Source]:
    """The sources of the config's `discovery:` list, in its order."""
    return [FileSource(Path(c.path), c.interval_s) for c in configs]
