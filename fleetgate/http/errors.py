"""What can go wrong talking to an upstream, translated once from socket and parser errors.

UpstreamError
 +-- ConnectError     the connection could not be opened (refused, unreachable, timed out)
 +-- LocalExhaustion  ...because the gateway itself ran out of file descriptors, memory or
 |                    socket buffers: no fault of the upstream's
 +-- ReadError        the connection closed or reset before the response ended
 +-- ProtocolError    the upstream sent something that is not HTTP/1.1
 +-- UpstreamTimeout  no answer head, or no end of the answer, in the time given

Messages never name the upstream's address (callers know which upstream they asked, and the
gateway's clients must not learn it from an error).
"""

from __future__ import annotations

from typing import Literal

# Which deadline an UpstreamTimeout is: the answer's head, the whole answer, or a silence
# inside the body.
TimeoutPhase = Literal["head", "total", "idle"]


class UpstreamError(Exception):
    """Talking to an upstream failed."""


class ConnectError(UpstreamError):
    """The connection could not be opened."""


class LocalExhaustion(UpstreamError):
    """The connection could not be opened because the gateway is out of a resource of its own
    (EMFILE, ENFILE, ENOMEM, ENOBUFS): the upstream was never reached."""


class ReadError(UpstreamError):
    """The connection ended before the whole response arrived."""


class ProtocolError(UpstreamError):
    """The upstream's bytes are not a valid HTTP/1.1 response."""


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer, or finish answering, in the time it was given."""

    def __init__(self, message: str, phase: TimeoutPhase = "head") -> None:
        super().__init__(message)
        self.phase = phase
