"""Known peaks: their floor holds from `prescale_s` before the start to the end, across
midnight, on their days only (UTC, read from the epoch seconds)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from fleetgate.autoscale.schedule import PeakSettings, Schedule


def at(day: int, hour: int, minute: int = 0, second: int = 0) -> float:
    """A time in March 2024 (UTC); the 1st was a Friday."""
    return datetime(2024, 3, day, hour, minute, second, tzinfo=UTC).timestamp()


def floor(schedule: Schedule, now: float) -> int:
    peak = schedule.peak(now)
    return 0 if peak is None else peak.min_replicas


def test_a_peak_holds_from_its_prescale_to_its_end() -> None:
    schedule = Schedule([PeakSettings(start="17:00", end="20:00", min_replicas=6)])
    times = [at(5, 16, 49, 59), at(5, 16, 50), at(5, 17), at(5, 19, 59, 59), at(5, 20)]
    assert [floor(schedule, t) for t in times] == [0, 6, 6, 6, 0]
    peak = schedule.peak(at(5, 18))
    assert peak is not None and peak.label == "17:00-20:00"


def test_a_peak_wraps_past_midnight() -> None:
    schedule = Schedule([PeakSettings(start="22:00", end="02:00", min_replicas=5, prescale_s=0)])
    times = [at(5, 21, 59), at(5, 22), at(5, 23, 59), at(6, 0), at(6, 1, 59), at(6, 2)]
    assert [floor(schedule, t) for t in times] == [0, 5, 5, 5, 5, 0]


def test_a_peak_holds_on_its_days_only_the_day_it_starts_on() -> None:
    friday = PeakSettings(start="22:00", end="02:00", min_replicas=5, days=["fri"])
    schedule = Schedule([friday])
    assert floor(schedule, at(1, 21, 55)) == 5  # Friday, pre-scaled
    assert floor(schedule, at(2, 1)) == 5  # Saturday night: Friday's peak
    assert floor(schedule, at(1, 1)) == 0  # Friday night: Thursday's, not listed
    assert floor(schedule, at(2, 22)) == 0  # Saturday


def test_prescaling_begins_the_day_before_a_peak_just_after_midnight() -> None:
    saturday = PeakSettings(start="00:05", end="01:00", min_replicas=4, days=["sat"])
    schedule = Schedule([saturday])
    assert floor(schedule, at(1, 23, 55)) == 4  # Friday 23:55: Saturday's, 600 s ahead
    assert floor(schedule, at(1, 23, 54, 59)) == 0
    assert floor(schedule, at(2, 23, 55)) == 0  # Saturday 23:55: Sunday's, not listed


def test_the_highest_of_overlapping_peaks_sets_the_floor() -> None:
    schedule = Schedule(
        [
            PeakSettings(start="08:00", end="18:00", min_replicas=3),
            PeakSettings(start="12:00", end="14:00", min_replicas=7, prescale_s=0),
        ]
    )
    assert [floor(schedule, at(4, h)) for h in (9, 12, 15)] == [3, 7, 3]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"start": "25:00"}, "`start` must be a UTC time \"HH:MM\", got '25:00'"),
        ({"end": "7:30"}, "`end` must be a UTC time \"HH:MM\", got '7:30'"),
        ({"end": "17:00"}, "`end` must differ from `start` (17:00), got 17:00"),
        ({"min_replicas": 0}, "`min_replicas` must be >= 1, got 0"),
        ({"prescale_s": -1.0}, "`prescale_s` must be in [0, 86400], got -1.0"),
        ({"days": ["friday"]}, "`days` must hold days among mon, tue, wed, thu, fri, sat, sun"),
    ],
)
def test_a_bad_peak_is_refused_by_name(fields: dict[str, object], message: str) -> None:
    params: dict[str, object] = {"start": "17:00", "end": "20:00", "min_replicas": 2, **fields}
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        PeakSettings(**params)  # type: ignore[arg-type]
