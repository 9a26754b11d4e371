"""Each source's config made into the source that reads it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fleetgate.discovery.file_source import FileSource
from fleetgate.discovery.found import Source
from fleetgate.discovery.registry import RedisRegistry
from fleetgate.discovery.settings import FileDiscovery, SourceConfig


def build_sources(configs: Sequence[SourceConfig]) -> list[Source]:
    """The sources of the config's `discovery:` list, in its order (nothing is read or
    connected yet)."""
    return [_source(c) for c in configs]


def _source(config: SourceConfig) -> Source:
    if isinstance(config, FileDiscovery):
        return FileSource(Path(config.path), config.interval_s)
    return RedisRegistry(config.url, config.key_prefix, config.interval_s)
