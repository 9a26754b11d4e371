"""Each source's config made into the source that reads it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from fleetgate.discovery.file_source import FileSource
from fleetgate.discovery.found import Source
from fleetgate.discovery.registry import RedisRegistry
from fleetgate.discovery.settings import (
    DnsDiscovery,
    FileDiscovery,
    RedisDiscovery,
    SourceConfig,
)


class SourceUnavailable(RuntimeError):
    """A configured source's library is not installed."""


def build_sources(configs: Sequence[SourceConfig], clock: Callable[[], float]) -> list[Source]:
    """The sources of the config's `discovery:` list, in its order (nothing is read or
    connected yet)."""
    return [_source(c, clock) for c in configs]


def _source(config: SourceConfig, clock: Callable[[], float]) -> Source:
    if isinstance(config, FileDiscovery):
        return FileSource(Path(config.path), config.interval_s)
    if isinstance(config, RedisDiscovery):
        return RedisRegistry(config.url, config.key_prefix, config.interval_s)
    if isinstance(config, DnsDiscovery):
        from fleetgate.discovery.dns_source import DnsSource  # dnspython: loaded when used

        return DnsSource(config, clock)
    try:
        from fleetgate.discovery.kubernetes_source import KubernetesSource
    except ImportError:
        raise SourceUnavailable(
            "discovery `type: kubernetes` needs its client library: pip install"
            " 'fleetgate[kubernetes]'"
        ) from None
    return KubernetesSource(config)
