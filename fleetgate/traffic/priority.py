"""Priority classes: which requests wait least and are shed last when a pool is saturated."""

from __future__ import annotations

from enum import IntEnum


class Priority(IntEnum):
    """Lower value, higher priority: the admission queue serves `critical` first and sheds
    `sheddable` first."""

    CRITICAL = 0
    STANDARD = 1
    SHEDDABLE = 2

    @property
    def label(self) -> str:
        """The name clients, config and metrics use: critical, standard, sheddable."""
        return _LABELS[self]

    @classmethod
    def parse(cls, name: str) -> Priority:
        """The class named `name` (any case); ValueError that lists the names otherwise."""
        try:
            return cls[name.strip().upper()]
        except KeyError:
            names = ", ".join(p.label for p in cls)
            raise ValueError(f"no priority class {name!r}; use one of {names}") from None


_LABELS = {p: p.name.lower() for p in Priority}  # read per request: made once
PRIORITY_NAMES = tuple(p.label for p in Priority)
