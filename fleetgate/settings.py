"""The base of every settings object, and the checks they share.

A settings class is the one schema of its concept: the config file's section decodes straight
into it (fleetgate/config.py), code builds it with keywords, and either way it is checked
where it is made, in its `__post_init__`, next to its fields. Unknown keys are refused by
name; a failed check names the field and says what to give (msgspec adds where it is in the
file: "... - at `$.pools[0].hedge`").
"""

from __future__ import annotations

import math

import msgspec


class Settings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Typed, frozen, every default stated; subclasses check their fields in __post_init__."""


def positive_seconds(name: str, value: float) -> None:
    if not 0 < value < math.inf:  # also refuses NaN
        raise ValueError(f"`{name}` must be a finite number of seconds > 0, got {value}")


def positive(name: str, value: float) -> None:
    if not 0 < value < math.inf:  # also refuses NaN
        raise ValueError(f"`{name}` must be a finite number > 0, got {value}")


def at_least(name: str, value: float, minimum: float) -> None:
    if not value >= minimum:
        raise ValueError(f"`{name}` must be >= {minimum:g}, got {value}")


def within(name: str, value: float, low: float, high: float, *, open_low: bool = False) -> None:
    """low <= value <= high (low < value with `open_low`)."""
    ok = (low < value if open_low else low <= value) and value <= high
    if not ok:
        bracket = "(" if open_low else "["
        raise ValueError(f"`{name}` must be in {bracket}{low:g}, {high:g}], got {value}")


def jitter(name: str, value: float) -> None:
    if not 0 <= value < 1:
        raise ValueError(f"`{name}` must be in [0, 1), got {value}")


def ordered(low_name: str, low: float, high_name: str, high: float) -> None:
    if not low <= high:
        raise ValueError(f"`{low_name}` ({low}) must not exceed `{high_name}` ({high})")
