"""fleetgate's one HTTP stack: a protocol-level server and a pooled client (uvloop, httptools),
and the transport seam the request lifecycle talks to upstreams through."""

from fleetgate.http.client import HttpClient, Origin
from fleetgate.http.errors import (
    ConnectError,
    ProtocolError,
    ReadError,
    UpstreamError,
    UpstreamTimeout,
)
from fleetgate.http.mock import MockTransport, Script, Sent
from fleetgate.http.transport import Transport, UpstreamAnswer

__all__ = [
    "ConnectError",
    "HttpClient",
    "MockTransport",
    "Origin",
    "ProtocolError",
    "ReadError",
    "Script",
    "Sent",
    "Transport",
    "UpstreamAnswer",
    "UpstreamError",
    "UpstreamTimeout",
]
