"""Which headers a proxy passes on, each way: a client's end-to-end request headers to the
upstream, the upstream's response headers to the client; never the hop-by-hop ones (RFC 9110
7.6.1), never those the gateway writes itself.

Each header name is judged once and the verdict kept, so a request costs one dict lookup per
header it carries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# Meant for one connection only, never passed on (RFC 9110 7.6.1; Proxy-* are the proxy's).
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
    b"transfer-encoding", b"upgrade",
})  # fmt: skip
# Request headers the gateway writes itself (http/client.py: host, content-length; the
# gateway: content-type, x-request-id), the client's `authorization` (the gateway's own
# credential to its clients: a backend gets the gateway's, never the client's), `expect` (the
# gateway has answered it), `accept-encoding` (the gateway reads every answer, a stream's
# events too: it asks for them uncompressed), and its own controls (x-fleetgate-*).
_NOT_FORWARDED = HOP_BY_HOP | {
    b"host", b"content-length", b"content-type", b"x-request-id", b"authorization", b"expect",
    b"accept-encoding",
}  # fmt: skip
OWN_PREFIX = b"x-fleetgate-"  # the gateway's own controls: steer a request, never passed on
_FORWARD, _DROP, _OWN = 0, 1, 2  # what becomes of a request header
# Response headers the gateway writes itself (http/writer.py: framing and the connection's
# fate; the request id).
_NOT_RETURNED = HOP_BY_HOP | {b"content-length", b"x-request-id"}
# Connection values naming no other header: nearly all of them (then nothing more to drop).
_PLAIN_CONNECTION = frozenset({b"keep-alive", b"Keep-Alive", b"close", b"Close"})
_MAX_VERDICTS = 4096  # names remembered; a client inventing names gets them judged each time


class RequestHeaders:
    """The request headers that go on to the upstream: all but those above and `deny`; and
    the gateway's own controls (x-fleetgate-*), which steer the request instead."""

    def __init__(self, deny: Iterable[str] = ()) -> None:
        self._denied = _NOT_FORWARDED | {name.lower().encode() for name in deny}
        self._verdicts: dict[bytes, int] = {}

    def _judge(self, name: bytes) -> int:
        if name.startswith(OWN_PREFIX):
            verdict = _OWN
        elif name in self._denied or name.startswith(b"proxy-"):
            verdict = _DROP
        else:
            verdict = _FORWARD
        if len(self._verdicts) < _MAX_VERDICTS:
            self._verdicts[name] = verdict
        return verdict

    def split(
        self, headers: dict[bytes, bytes]
    ) -> tuple[list[tuple[bytes, bytes]], dict[bytes, bytes]]:
        """Those of `headers` (lower-case names, as http/server.py parses them) to pass on,
        and the gateway's own controls among them."""
        verdicts = self._verdicts
        out = []
        own: dict[bytes, bytes] | None = None
        for name, value in headers.items():
            verdict = verdicts.get(name)
            if verdict is None:
                verdict = self._judge(name)
            if verdict == _FORWARD:
                out.append((name, value))
            elif verdict == _OWN:
                if own is None:
                    own = {}
                own[name] = value
        connection = headers.get(b"connection")
        if connection is not None and connection not in _PLAIN_CONNECTION:
            # The headers it names are hop-by-hop too.
            named = {token.strip().lower() for token in connection.split(b",")}
            out = [(name, value) for name, value in out if name not in named]
        return out, own if own is not None else {}


def returned(
    headers: Sequence[tuple[bytes, bytes]], own_limits: bool = False
) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers (lower-case names) that go on to the client; with
    `own_limits` (the gateway sends its tenant's x-ratelimit-*), none of the upstream's
    x-ratelimit-*: a client given both would read a pair of each, or its provider's limits."""
    out = []
    connection = None
    for name, value in headers:
        if name in _NOT_RETURNED:
            if name == b"connection":
                connection = value
        # The first byte before the prefix: nearly no name starts with x (120).
        elif not (own_limits and name and name[0] == 120 and name.startswith(b"x-ratelimit-")):
            out.append((name, value))
    if connection is not None and connection not in _PLAIN_CONNECTION:
        # The headers it names are hop-by-hop too.
        named = {token.strip().lower() for token in connection.split(b",")}
        out = [(name, value) for name, value in out if name not in named]
    return out
