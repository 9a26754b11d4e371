"""The recommender: each signal asks for replicas in proportion (prefill saturation included),
up at once and down only after its window, within the step limits, the bounds and the
schedule's floor; and a recorded prefill-heavy ramp replayed through it."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fleetgate.autoscale.recommender import (
    AutoscaleSettings,
    Recommendation,
    Recommender,
    Signals,
)
from fleetgate.autoscale.schedule import PeakSettings

RAMP = Path(__file__).parent / "ramp_signals.jsonl"


def signals(
    replicas: int,
    *,
    in_flight: float = 0.0,
    queued: float = 0.0,
    prefill_tokens: float = 0.0,
    kv_usage: float | None = None,
    burn_rate: float | None = None,
) -> Signals:
    return Signals(
        replicas=replicas, queued=queued, in_flight=in_flight, prefill_tokens=prefill_tokens,
        kv_usage=kv_usage, burn_rate=burn_rate,
    )  # fmt: skip


def once(reading: Signals, now: float = 0.0, **settings: Any) -> Recommendation:
    """The first recommendation of a fresh recommender (no history: no stabilisation)."""
    params = {"max_replicas": 20, "max_step_up": 20, "scale_down_window_s": 0.0, **settings}
    return Recommender(AutoscaleSettings(**params)).recommend(reading, now)


# Settings


def test_the_defaults_are_valid_and_decode_from_a_config_section() -> None:
    section = {"enabled": True, "schedule": [{"start": "17:00", "end": "20:00", "min_replicas": 4}]}
    settings = msgspec.convert(section, AutoscaleSettings)
    assert settings.schedule == [PeakSettings(start="17:00", end="20:00", min_replicas=4)]
    assert AutoscaleSettings().scale_down_window_s == 300.0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("min_replicas", -1, "`min_replicas` must be >= 0, got -1"),
        ("max_replicas", 0, "`max_replicas` must be >= 1, got 0"),
        ("min_replicas", 9, "`min_replicas` (9) must not exceed `max_replicas` (8)"),
        ("target_in_flight", 0.0, "`target_in_flight` must be a finite number > 0, got 0.0"),
        ("target_prefill_tokens", -1.0, "`target_prefill_tokens` must be a finite number > 0"),
        ("target_kv_usage", 1.5, "`target_kv_usage` must be in (0, 1], got 1.5"),
        ("burn_rate_up", 0.0, "`burn_rate_up` must be a finite number > 0, got 0.0"),
        ("tolerance", -0.1, "`tolerance` must be in [0, 1], got -0.1"),
        ("scale_up_window_s", -1.0, "`scale_up_window_s` must be in [0, 86400], got -1.0"),
        ("scale_down_window_s", float("inf"), "`scale_down_window_s` must be in [0, 86400]"),
        ("max_step_up", 0, "`max_step_up` must be >= 1, got 0"),
        ("max_step_down", 0, "`max_step_down` must be >= 1, got 0"),
    ],
)
def test_a_bad_setting_is_refused_by_name(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        AutoscaleSettings(**{field: value})  # type: ignore[arg-type]


def test_a_peak_over_max_replicas_and_an_unknown_key_are_refused_by_name() -> None:
    peak = PeakSettings(start="17:00", end="20:00", min_replicas=9)
    with pytest.raises(ValueError, match=r"`schedule\[0\].min_replicas` \(9\) must not exceed"):
        AutoscaleSettings(schedule=[peak])
    with pytest.raises(msgspec.ValidationError, match="unknown field `max_replica`"):
        msgspec.convert({"max_replica": 3}, AutoscaleSettings)


# The signals


def test_requests_over_their_target_ask_for_replicas_in_proportion() -> None:
    rec = once(signals(2, in_flight=40, queued=8))  # 48 / (2 * 16) = 1.5
    assert (rec.desired, rec.raw, rec.reason) == (3, 3, "in_flight 1.5x target")


def test_prefill_backlog_alone_scales_up_while_kv_use_is_low() -> None:
    rec = once(signals(2, in_flight=6, prefill_tokens=2.4 * 2 * 8192, kv_usage=0.3))
    assert (rec.desired, rec.reason) == (5, "prefill_tokens 2.4x target")  # ceil(2 * 2.4)


def test_kv_use_counts_when_known_and_not_when_unknown() -> None:
    assert once(signals(4, in_flight=40, kv_usage=0.96)).desired == 5  # 1.2x: ceil(4.8)
    assert once(signals(4, in_flight=40, kv_usage=0.96)).reason == "kv_usage 1.2x target"
    assert once(signals(4, in_flight=40, kv_usage=None)).desired == 3  # 40 / 16 = 2.5


def test_ratios_within_the_tolerance_change_nothing() -> None:
    assert once(signals(4, in_flight=4 * 16 * 1.09)).desired == 4
    assert once(signals(4, in_flight=4 * 16 * 0.92)).desired == 4
    assert once(signals(4, in_flight=4 * 16 * 1.12)).desired == 5  # ceil(4.48)
    assert once(signals(4, in_flight=4 * 16 * 0.85)).desired == 4  # ceil(3.4)
    assert once(signals(4, in_flight=4 * 16 * 0.70)).desired == 3  # ceil(2.8)


def test_float_rounding_does_not_add_a_replica() -> None:
    assert once(signals(10, kv_usage=0.56)).raw == 7  # 10 * 0.7 is 7.000000000000001


def test_a_burning_slo_asks_for_one_more_replica_than_now() -> None:
    rec = once(signals(3, in_flight=40, burn_rate=2.0))  # load alone: 40 / 48, within
    assert (rec.desired, rec.reason) == (4, "burn_rate 2.0 >= 2")
    assert once(signals(3, in_flight=40, burn_rate=1.9)).desired == 3
    assert once(signals(3, in_flight=96, burn_rate=5.0)).desired == 6  # load asks for more


def test_a_pool_with_no_replicas_asks_for_what_its_demand_needs() -> None:
    rec = once(signals(0, queued=40), min_replicas=0)
    assert (rec.desired, rec.reason) == (3, "demand with no replicas")  # ceil(40 / 16)
    assert once(signals(0, prefill_tokens=100), min_replicas=0).desired == 1
    assert once(signals(0), min_replicas=0).desired == 0


def test_the_bounds_hold_with_their_reasons() -> None:
    rec = once(signals(1))
    assert (rec.desired, rec.raw, rec.reason, rec.floor) == (1, 0, "min_replicas", 1)
    rec = once(signals(6, in_flight=6 * 16 * 3), max_replicas=8)
    assert (rec.desired, rec.raw, rec.reason) == (8, 18, "max_replicas")


# Stabilisation and steps


def test_it_scales_up_at_once_by_max_step_up_at_most() -> None:
    rec = once(signals(2, in_flight=2 * 16 * 5), max_step_up=4)
    assert (rec.desired, rec.raw, rec.reason) == (6, 10, "max_step_up")


def test_it_scales_down_only_once_the_whole_window_asks_for_less() -> None:
    r = Recommender(AutoscaleSettings(max_step_down=1))
    busy, idle = signals(6, in_flight=6 * 16), signals(6, in_flight=2 * 16)
    assert r.recommend(busy, now=0.0).desired == 6
    held = r.recommend(idle, now=15.0)
    assert (held.desired, held.raw, held.reason) == (6, 2, "stabilised (down window)")
    assert r.recommend(busy, now=150.0).desired == 6  # a dip in the window restarts it
    assert [r.recommend(idle, now=t).desired for t in (200.0, 449.0)] == [6, 6]
    rec = r.recommend(idle, now=450.0)  # the 150 s reading is 300 s old: out
    assert (rec.desired, rec.reason) == (5, "max_step_down")


def test_a_scale_up_window_waits_for_a_sustained_rise() -> None:
    r = Recommender(AutoscaleSettings(scale_up_window_s=60.0))
    assert r.recommend(signals(2, in_flight=32), now=0.0).desired == 2
    rise = signals(2, in_flight=64)
    held = r.recommend(rise, now=15.0)
    assert (held.desired, held.raw, held.reason) == (2, 4, "stabilised (up window)")
    assert [r.recommend(rise, now=t).desired for t in (30.0, 45.0, 60.0)] == [2, 2, 4]


def test_a_wall_clock_stepping_back_starts_the_windows_over() -> None:
    r = Recommender(AutoscaleSettings())
    assert r.recommend(signals(6, in_flight=6 * 16), now=1000.0).desired == 6
    assert r.recommend(signals(6, in_flight=2 * 16), now=500.0).desired == 5


# The schedule's floor


def test_a_peaks_floor_is_reached_ahead_of_it_in_one_decision() -> None:
    peak = PeakSettings(start="17:00", end="20:00", min_replicas=10, prescale_s=600.0)
    settings = AutoscaleSettings(max_replicas=12, max_step_up=2, schedule=[peak])
    day = datetime(2024, 3, 1, tzinfo=UTC).timestamp()
    before = Recommender(settings).recommend(signals(2, in_flight=32), now=day + 16 * 3600)
    assert (before.desired, before.floor) == (2, 1)
    rec = Recommender(settings).recommend(signals(2, in_flight=32), now=day + 16 * 3600 + 50 * 60)
    assert (rec.desired, rec.floor, rec.reason) == (10, 10, "schedule peak 17:00-20:00")


def test_min_replicas_over_a_peaks_floor_is_the_floor() -> None:
    peak = PeakSettings(start="00:00", end="23:59", min_replicas=2)
    rec = once(signals(1), now=3600.0, min_replicas=3, schedule=[peak])
    assert (rec.desired, rec.floor, rec.reason) == (3, 3, "min_replicas")


# A recorded ramp


class Tick(Signals, frozen=True, kw_only=True):
    t: float


def replay(settings: AutoscaleSettings) -> tuple[list[Tick], list[Recommendation]]:
    """The recorded pool (held at 2 replicas) replayed in a closed loop: each tick runs the
    replicas the previous one recommended, with the recorded demand, its KV cache spread over
    them (the mean KV use scaled by recorded / running replicas)."""
    ticks = [msgspec.json.decode(line, type=Tick) for line in RAMP.read_bytes().splitlines()]
    recommender, replicas, recs = Recommender(settings), ticks[0].replicas, []
    for tick in ticks:
        kv = tick.kv_usage * tick.replicas / replicas if tick.kv_usage is not None else None
        reading = msgspec.structs.replace(tick, replicas=replicas, kv_usage=kv)
        rec = recommender.recommend(reading, now=tick.t)
        recs.append(rec)
        replicas = rec.desired
    return ticks, recs


def test_a_prefill_heavy_ramp_scales_up_on_prefill_without_flapping() -> None:
    ticks, recs = replay(AutoscaleSettings(max_replicas=10))
    assert len(ticks) == 100 and max(t.kv_usage or 0 for t in ticks) < 0.35
    ran = [ticks[0].replicas, *(r.desired for r in recs[:-1])]  # what each tick ran
    moves = [
        (tick.t, rec, rec.desired - before)
        for tick, rec, before in zip(ticks, recs, ran, strict=True)
        if rec.desired != before
    ]
    # Every rise, then every fall (no flapping), each within the steps (+4, -1).
    assert [rec.desired for _, rec, _ in moves] == [3, 4, 5, 7, 8, 7, 6, 5, 4, 3, 2]
    assert all(rec.reason.startswith("prefill_tokens") for _, rec, step in moves if step > 0)
    last_8 = max(tick.t for tick, rec in zip(ticks, recs, strict=True) if rec.raw == 8)
    first_fall = next(t for t, _, step in moves if step < 0)
    assert (last_8, first_fall) == (750.0, 1050.0)  # the window after the last 8 asked
    for t, rec, step in moves:
        if step < 0:  # only once every raw of the window asks for no more
            window = [r.raw for tick, r in zip(ticks, recs, strict=True) if 0 <= t - tick.t < 300]
            assert max(window) <= rec.desired, t


def test_the_same_ramp_on_queue_and_kv_alone_never_scales_up() -> None:
    """llm-d's signals (KV use, queue length): the prefill backlog that saturated the pool
    goes unseen."""
    _, recs = replay(AutoscaleSettings(max_replicas=10, target_prefill_tokens=1e12))
    assert max(r.desired for r in recs) == 2
