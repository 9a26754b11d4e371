"""Known peaks: a floor of replicas during them, reached `prescale_s` before each starts.

Times are UTC and read by arithmetic on the injected `now` (seconds since the epoch): POSIX
time has no leap seconds, so day d starts at d * 86,400 and day 0, 1970-01-01, was a
Thursday. A peak belongs to the day it starts on: "22:00-02:00" on `fri` runs from Friday
22:00 to Saturday 02:00, and its pre-scaling may begin the day before one starting just
after midnight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from fleetgate.settings import Settings, at_least, within

DAY_S = 86_400
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday (mon = 0)


class PeakSettings(Settings, frozen=True):
    """A known peak: at least `min_replicas` from `prescale_s` before `start` until `end`,
    each day (UTC) on the listed weekdays (empty: every day)."""

    start: str  # "HH:MM", UTC
    end: str  # "HH:MM", UTC; at or before `start`, it ends the next day (22:00-02:00)
    min_replicas: int
    prescale_s: float = 600.0  # replicas take minutes to load a model: start them this early
    days: list[str] = []

    def __post_init__(self) -> None:
        start, end = seconds_of_day("start", self.start), seconds_of_day("end", self.end)
        if start == end:
            raise ValueError(f"`end` must differ from `start` ({self.start}), got {self.end}")
        at_least("min_replicas", self.min_replicas, 1)
        within("prescale_s", self.prescale_s, 0, DAY_S)
        for day in self.days:
            if day not in DAYS:
                raise ValueError(f"`days` must hold days among {', '.join(DAYS)}, got {day!r}")


def seconds_of_day(name: str, text: str) -> int:
    """ "HH:MM" as seconds since midnight; a ValueError naming the field otherwise."""
    hours, colon, minutes = text.partition(":")
    valid = (
        colon == ":"
        and len(hours) == len(minutes) == 2
        and (hours + minutes).isdigit()
        and int(hours) < 24
        and int(minutes) < 60
    )
    if not valid:
        raise ValueError(f'`{name}` must be a UTC time "HH:MM", got {text!r}')
    return int(hours) * 3600 + int(minutes) * 60


class Peak(msgspec.Struct, frozen=True, kw_only=True):
    """A peak as the schedule reads it: its window in seconds from the start of its day."""

    label: str  # "17:00-20:00", as configured
    min_replicas: int
    begin_s: float  # start - prescale_s: negative when it begins the day before
    end_s: int  # past DAY_S when the peak ends the next day
    weekdays: frozenset[int]  # mon = 0

    def covers(self, now: float, day: int) -> bool:
        """Whether `now` is within this peak's window of the given day (since the epoch)."""
        since = now - day * DAY_S
        weekday = (day + _EPOCH_WEEKDAY) % 7
        return weekday in self.weekdays and self.begin_s <= since < self.end_s


class Schedule:
    """The peaks of one pool; `peak(now)` is the one that sets the floor now, if any."""

    def __init__(self, peaks: Sequence[PeakSettings]) -> None:
        self._peaks = [_peak(p) for p in peaks]

    def peak(self, now: float) -> Peak | None:
        """The covering peak with the highest floor. A window begins at most a day before its
        day starts (prescale_s <= 1 day) and ends within the next day, so only the windows of
        yesterday, today and tomorrow can cover `now`."""
        today = math.floor(now / DAY_S)
        found: Peak | None = None
        for peak in self._peaks:
            if any(peak.covers(now, day) for day in (today - 1, today, today + 1)) and (
                found is None or peak.min_replicas > found.min_replicas
            ):
                found = peak
        return found


def _peak(settings: PeakSettings) -> Peak:
    start = seconds_of_day("start", settings.start)
    end = seconds_of_day("end", settings.end)
    days = settings.days or DAYS
    return Peak(
        label=f"{settings.start}-{settings.end}",
        min_replicas=settings.min_replicas,
        begin_s=start - settings.prescale_s,
        end_s=end if end > start else end + DAY_S,
        weekdays=frozenset(DAYS.index(d) for d in days),
    )
