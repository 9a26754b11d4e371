"""What a discovery source says: the backends it found, each as the gateway would configure it.

A source reads its whole set each time (a file, a DNS answer, a registry): the reconciler
(discovery/reconcile.py) compares sets, so a source never has to say what changed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from fleetgate.fleet.backend import check_joining_url
from fleetgate.fleet.engines import KINDS
from fleetgate.settings import Settings


class SourceError(Exception):
    """A source could not be read (its file is broken, its server is down): the last set it
    read is kept."""


class Found(Settings, frozen=True):
    """One backend a source found: the model it serves and how to reach it; `ready` false:
    it exists but takes nothing new (Kubernetes' not-ready endpoint), so it is drained."""

    model: str
    url: str
    weight: float = 1.0
    labels: dict[str, str] = {}
    ready: bool = True
    engine: str = "auto"
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        if not self.model or not self.model.isprintable():
            raise ValueError("`model` must be printable text")
        check_joining_url(self.url)
        if not 0 < self.weight < math.inf:
            raise ValueError(f"`weight` must be a finite number > 0, got {self.weight}")
        if self.engine not in KINDS:
            raise ValueError(f"`engine`: {self.engine!r} is not one of {', '.join(KINDS)}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError("`max_in_flight` must be >= 1 (or absent: no limit)")


class Source(Protocol):
    """Reads the whole set of backends it knows, on an interval."""

    @property
    def name(self) -> str:
        """How logs and metrics call it, e.g. `file:/etc/fleetgate/backends.yaml`."""
        ...

    @property
    def interval_s(self) -> float:
        """How long between two reads."""
        ...

    async def read(self) -> Sequence[Found]:
        """Every backend it knows now; SourceError when it cannot tell."""
        ...

    async def close(self) -> None:
        """Let go of what it holds open (a connection)."""
        ...
