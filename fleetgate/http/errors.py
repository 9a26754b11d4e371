"""What can go wrong talking to an upstream, translated once from socket and parser errors.

UpstreamError
 +-- ConnectError     the connection could not be opened (refused, unreachable, timed out)
 +-- ReadError        the connection closed or reset before the response ended
 +-- ProtocolError    the upstream sent something that is not HTTP/1.1
 +-- UpstreamTimeout  no answer head, or no end of the answer, in the time given
"""

from __future__ import annotations


class UpstreamError(Exception):
    """Talking to an upstream failed."""


class ConnectError(UpstreamError):
    """The connection could not be opened."""


class ReadError(UpstreamError):
    """The connection ended before the whole response arrived."""


class ProtocolError(UpstreamError):
    """The upstream's bytes are not a valid HTTP/1.1 response."""


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer, or finish answering, in the time it was given."""
