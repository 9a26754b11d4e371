"""A backend's `kv_events:` section: where its engine publishes its KV-cache events."""

from __future__ import annotations

import re

from fleetgate.kv_events.wire import ENCODINGS
from fleetgate.settings import Settings, positive_seconds

# tcp://HOST:PORT (a name, IPv4 or [IPv6]) or ipc://PATH: what a ZMQ socket connects to.
_ENDPOINT = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}|ipc://[^\s]+")


class KvEventsConfig(Settings, frozen=True):
    """vLLM's `--kv-events-config` publisher (or SGLang's), as a subscriber reaches it. On a
    `sim:` backend the sim worker publishes, on ports of its own: give no endpoints."""

    endpoint: str | None = None  # its ZMQ PUB socket, e.g. tcp://10.0.0.5:5557
    replay_endpoint: str | None = None  # its ROUTER replay socket; None: gaps are not replayed
    topic: str = "kv-events"
    encoding: str = "map"  # a sim: backend's events: "map" or "array" (both are read)
    replay_timeout_s: float = 1.0  # a replay that sends nothing for this long has ended

    def __post_init__(self) -> None:
        for name, value in (("endpoint", self.endpoint), ("replay_endpoint", self.replay_endpoint)):
            if value is not None and _ENDPOINT.fullmatch(value) is None:
                raise ValueError(f"`{name}` must be tcp://HOST:PORT or ipc://PATH, got {value!r}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"`encoding` must be one of {', '.join(ENCODINGS)}")
        if not self.topic.isprintable() or len(self.topic) > 255:
            raise ValueError("`topic` must be printable text of at most 255 characters")
        positive_seconds("replay_timeout_s", self.replay_timeout_s)
