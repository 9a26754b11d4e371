"""How long the gateway waits on a backend: deadlines on each upstream exchange, enforced by
the transport (http/deadlines.py), set by each attempt (upstream/attempt.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long the gateway waits on a backend of a pool (connecting: the client's own)."""

    first_byte_s: float = 180.0  # from sending the request to the answer's head; then 504
    total_s: float = 1800.0  # the whole exchange, a stream's last chunk included; then 504
    idle_s: float = 60.0  # longest silence inside an answer (between stream chunks)
    connect_s: float = 5.0  # opening a new connection to a backend; then the next one
    # What each timeout says when it fires, made once rather than per request.
    total_message: str = field(init=False, repr=False, compare=False)
    idle_message: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        total = f"the answer took longer than the total timeout of {self.total_s:g} s"
        idle = f"the backend sent nothing for the idle timeout of {self.idle_s:g} s"
        object.__setattr__(self, "total_message", total)
        object.__setattr__(self, "idle_message", idle)
