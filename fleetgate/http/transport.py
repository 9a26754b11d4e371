"""The seam between the request lifecycle and the network: what it needs of an upstream.

`HttpClient` (http/client.py) is the transport the gateway runs on; `MockTransport`
(http/mock.py) answers from a script, for tests of the lifecycle without sockets; a virtual
transport can answer in virtual time, where a stream's progress is a few events (first token,
tokens so far when it breaks, end) rather than one per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fleetgate.http.client import Origin
    from fleetgate.http.response import RelaySink


class UpstreamAnswer(Protocol):
    """An answer whose head has arrived (`status`, `header`); its body comes through `read()`
    or `relay()`. Failures raise the errors of http/errors.py."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Sequence[tuple[bytes, bytes]]:
        """Every header as it came (lower-case names)."""

    def header(self, name: bytes) -> bytes | None:
        """The value of a header (lower-case name), or None."""

    async def read(self) -> bytes:
        """The whole body."""

    async def relay(self, sink: RelaySink) -> None:
        """Hand the body to `sink` as it arrives; return when it has ended."""

    def expire_in(
        self, delay_s: float, message: str, idle_s: float | None = None, idle_message: str = ""
    ) -> None:
        """Fail with `UpstreamTimeout` unless the body ends within `delay_s` (or goes silent
        for `idle_s`)."""

    def pause_reading(self) -> None:
        """Stop taking body from the upstream until `resume_reading` (a slow client)."""

    def resume_reading(self) -> None: ...


class Transport(Protocol):
    """Sends one request to an upstream and gives back its answer once the head is in."""

    async def request(
        self,
        origin: Origin,
        method: bytes,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes = b"",
        *,
        timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
    ) -> UpstreamAnswer:
        """`timeout_s` bounds the wait for the answer's head (`UpstreamTimeout`)."""
