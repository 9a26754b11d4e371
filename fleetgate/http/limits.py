"""What the server lets one client, and all of them together, cost it: the limits (the config's
`server:` section) and the count of request-body bytes held across connections."""

from __future__ import annotations

from fleetgate.settings import Settings, at_least, ordered, positive_seconds


class ServerLimits(Settings, frozen=True):
    """Limits that keep a bad client from costing the server memory or connections (the
    config's `server:` section adds where to listen: fleetgate/config.py)."""

    max_body_bytes: int = 4 * 1024 * 1024  # request bodies larger than this get a 413
    max_header_bytes: int = 64 * 1024  # request line and headers larger than this get a 431
    keep_alive_timeout_s: float = 75.0  # an idle keep-alive connection is closed after this
    request_timeout_s: float = 60.0  # from a request's first byte to its last, or 408
    write_high_water: int = 256 * 1024  # pause a streaming handler above this much unsent data
    # Open client connections; one more is answered 503 (Retry-After) and closed at once.
    max_connections: int = 10_000
    # Request bodies held in memory across all connections, from their first byte until their
    # answer ends; a body that would go over is discarded as it arrives and answered 503.
    max_buffered_body_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        at_least("max_body_bytes", self.max_body_bytes, 1)
        at_least("max_header_bytes", self.max_header_bytes, 1)
        positive_seconds("keep_alive_timeout_s", self.keep_alive_timeout_s)
        positive_seconds("request_timeout_s", self.request_timeout_s)
        at_least("write_high_water", self.write_high_water, 1)
        at_least("max_connections", self.max_connections, 1)
        ordered(
            "max_body_bytes", self.max_body_bytes,
            "max_buffered_body_bytes", self.max_buffered_body_bytes,
        )  # fmt: skip


class BodyBudget:
    """The request-body bytes all connections of a server hold, against their limit."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, n: int) -> bool:
        """Hold `n` more bytes, unless that would go over the limit (then hold nothing)."""
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n
