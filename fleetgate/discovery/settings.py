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


class RedisDiscovery(Settings, frozen=True, tag="redis", tag_field="type"):
    """The workers registered in a Redis (discovery/registry.py), read on an interval."""

    url: str  # redis://[:password@]host[:port][/db]
    key_prefix: str = "fleetgate"  # as the workers register under (`--register-prefix`)
    interval_s: float = 0.5  # how often the registry is read

    def __post_init__(self) -> None:
        positive_seconds("interval_s", self.interval_s)
        if not self.key_prefix or not self.key_prefix.isprintable():
            raise ValueError("`key_prefix` must be printable text")


SourceConfig = FileDiscovery | RedisDiscovery
"""Any source's config, told apart by its `type`."""
