"""The GPU thresholds: what readings make a backend unhealthy or throttled, and when it comes
back, over a real pool with the time given."""

from __future__ import annotations

import msgspec
import pytest

from fleetgate.config import ConfigError, parse_config
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.gpu import GpuReading
from fleetgate.fleet.health import HealthFlag, Verdict
from fleetgate.fleet.pool import Pool
from fleetgate.health.gpu import GpuBoard, GpuSettings, GpuWatch, judge
from fleetgate.lifecycle.events import GpuChanged

CLEAN = GpuReading(index=0, temperature_c=60, ecc_uncorrected=0, xid_errors=[],
                   throttle_reasons=["sw_power_cap"])  # fmt: skip


def reading(**fields: object) -> GpuReading:
    return msgspec.structs.replace(CLEAN, **fields)


def pool_of(n: int = 2) -> tuple[Pool, list[BackendState]]:
    states = [BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",)))
              for i in range(n)]  # fmt: skip
    return Pool("m", states), states


def test_hard_thresholds_are_faults_and_throttle_reasons_only_those_configured() -> None:
    s = GpuSettings()
    assert judge([CLEAN], s).faults == ()
    assert judge([CLEAN], s).throttling == ()  # sw_power_cap: a busy GPU, not a fault
    assert judge([reading(xid_errors=[79, 13])], s).faults == ("gpu 0: xid 79",)  # 13: the app's
    assert judge([reading(ecc_uncorrected=2)], s).faults == (
        "gpu 0: 2 uncorrected ECC errors (max 0)",
    )
    assert judge([reading(temperature_c=91)], s).faults == ("gpu 0: 91 C (max 90)",)
    assert judge([reading(temperature_c=90)], s).faults == ()  # over the max, not at it
    assert judge([GpuReading(index=3, lost=True)], s).faults == ("gpu 3: lost",)
    many = [CLEAN, reading(index=1, throttle_reasons=["hw_thermal", "gpu_idle"])]
    assert judge(many, s).throttling == ("gpu 1: hw_thermal",)
    lenient = GpuSettings(unhealthy_on_xid=False, max_temperature_c=None, max_ecc_uncorrected=None)
    assert judge([reading(xid_errors=[79], temperature_c=120, ecc_uncorrected=9)], lenient) == (
        judge([CLEAN], s)
    )  # fmt: skip


def test_unknown_fields_read_as_none_are_not_faults() -> None:
    assert judge([GpuReading(index=0)], GpuSettings()).faults == ()


def test_an_xid_takes_the_backend_out_until_readings_are_clean_for_a_while() -> None:
    pool, (b0, b1) = pool_of()
    watch = GpuWatch(GpuSettings(clean_for_s=10.0), pool)
    changed = watch.record(b0, [reading(xid_errors=[79])], now=1.0)
    assert isinstance(changed, GpuChanged)
    assert (changed.state, changed.reasons, changed.model) == ("fault", ("gpu 0: xid 79",), "m")
    assert b0.flags == HealthFlag.GPU_FAULT and b0.verdict(1.0) is Verdict.UNHEALTHY
    assert pool.candidates == (b1,)
    assert watch.record(b0, [CLEAN], now=2.0) is None  # clean since 2 s
    assert watch.record(b0, [CLEAN], now=11.9) is None
    assert pool.candidates == (b1,)
    back = watch.record(b0, [CLEAN], now=12.0)
    assert back is not None and back.state == "ok"
    assert not b0.flags and pool.candidates == (b0, b1)


def test_a_fault_while_returning_starts_the_clean_time_again() -> None:
    pool, (b0, _) = pool_of()
    watch = GpuWatch(GpuSettings(clean_for_s=10.0), pool)
    watch.record(b0, [reading(temperature_c=95)], now=0.0)
    watch.record(b0, [CLEAN], now=5.0)
    watch.record(b0, [reading(temperature_c=95)], now=9.0)
    watch.record(b0, [CLEAN], now=16.0)
    assert b0.flags == HealthFlag.GPU_FAULT  # clean since 16, not 5
    watch.record(b0, [CLEAN], now=26.0)
    assert not b0.flags


def test_a_throttling_backend_stays_routable_at_a_lower_weight() -> None:
    pool, (b0, b1) = pool_of()
    pool.set_weight(b0, 2.0, 0.0)
    watch = GpuWatch(GpuSettings(throttled_weight=0.25), pool)
    hot = reading(throttle_reasons=["sw_thermal", "hw_slowdown"])
    changed = watch.record(b0, [hot], now=1.0)
    assert changed is not None and changed.state == "throttled"
    assert changed.reasons == ("gpu 0: sw_thermal", "gpu 0: hw_slowdown")  # as read
    assert b0.weight == 0.5 and b0.verdict(1.0) is Verdict.DEGRADED
    assert pool.candidates == (b0, b1)
    assert watch.record(b0, [hot], now=2.0) is None  # still throttled: no change, no event
    assert watch.record(b0, [CLEAN], now=3.0) is not None
    assert b0.weight == 2.0 and b0.verdict(3.0) is Verdict.HEALTHY


def test_the_throttle_share_keeps_through_a_new_configured_weight_and_a_slow_start() -> None:
    pool, (b0, _) = pool_of()
    watch = GpuWatch(GpuSettings(), pool)
    watch.record(b0, [reading(throttle_reasons=["hw_thermal"])], now=0.0)
    pool.set_weight(b0, 4.0, 0.0)
    assert b0.weight == 2.0
    pool.eject(b0, 0.0, until=1.0)
    pool.update(1.0)  # back, at the slow start's floor: 4 x 0.1 x 0.5
    assert b0.weight == pytest.approx(0.2)


def test_the_board_finds_a_backend_in_every_pool_that_takes_readings() -> None:
    pool_a, (a0, _) = pool_of()
    pool_b, (b0, _) = pool_of()
    heard: list[GpuChanged] = []
    board = GpuBoard(lambda: 5.0, heard.append)
    board.watch(GpuWatch(GpuSettings(), pool_a))
    board.watch(GpuWatch(GpuSettings(unhealthy_on_xid=False), pool_b))
    assert board.record("b0", [reading(xid_errors=[48])])
    assert a0.flags == HealthFlag.GPU_FAULT and not b0.flags  # each pool on its own settings
    assert [e.backend for e in heard] == ["b0"]
    assert a0.gpus is not None and a0.gpus.xid_totals == {0: 1} and a0.gpus.at == 5.0
    assert not board.record("10.9.9.9:1", [CLEAN])


def test_the_gpu_section_is_checked_where_it_is() -> None:
    pool = {"model": "m", "backends": [{"url": "http://127.0.0.1:1"}]}
    gpu = {"enabled": True, "max_temperature_c": 85, "degrade_on_throttle": ["hw_thermal"]}
    config = parse_config({"pools": [{**pool, "gpu": gpu}]})
    assert config.pools[0].gpu.degrade_on_throttle == ("hw_thermal",)
    with pytest.raises(ConfigError, match=r"\$\.pools\[0\]\.gpu\.degrade_on_throttle"):
        parse_config({"pools": [{**pool, "gpu": {"degrade_on_throttle": ["thermal"]}}]})
    with pytest.raises(ConfigError, match=r"throttled_weight.*\$\.pools\[0\]\.gpu"):
        parse_config({"pools": [{**pool, "gpu": {"throttled_weight": 0}}]})
    with pytest.raises(ConfigError, match="max_temp"):
        parse_config({"pools": [{**pool, "gpu": {"max_temp": 80}}]})


def test_a_faulted_backend_returns_to_routing_when_its_agent_goes_quiet() -> None:
    pool, (b0, b1) = pool_of()
    now = [0.0]
    heard: list[GpuChanged] = []
    board = GpuBoard(lambda: now[0], heard.append)
    board.watch(GpuWatch(GpuSettings(stale_after_s=15.0, clean_for_s=30.0), pool))
    board.record("b0", [reading(xid_errors=[79])])
    assert pool.candidates == (b1,)
    now[0] = 14.9
    board.expire()
    assert pool.candidates == (b1,) and [e.state for e in heard] == ["fault"]
    now[0] = 15.0  # no new reading: the agent died with the GPU's fault its last word
    board.expire()
    assert not b0.flags and b0.verdict(15.0) is Verdict.HEALTHY
    assert pool.candidates == (b0, b1)
    stale = heard[-1]
    assert (stale.state, stale.reasons, stale.backend) == (
        "stale",
        ("no readings for 15.0 s",),
        "b0",
    )
    assert b0.gpus is not None and b0.gpus.state == "stale"
    assert b0.gpus.faults == ("gpu 0: xid 79",) and b0.gpus.at == 0.0  # kept, for the operator
    assert b1.gpus is None  # no agent ever: nothing to expire


def test_a_throttled_backend_returns_to_full_weight_when_its_agent_goes_quiet() -> None:
    pool, (b0, _) = pool_of()
    pool.set_weight(b0, 2.0, 0.0)
    watch = GpuWatch(GpuSettings(stale_after_s=10.0, throttled_weight=0.5), pool)
    watch.record(b0, [reading(throttle_reasons=["hw_thermal"])], now=0.0)
    assert b0.weight == 1.0 and b0.verdict(0.0) is Verdict.DEGRADED
    assert watch.expire(now=9.0) == []
    (changed,) = watch.expire(now=10.0)
    assert changed.state == "stale"
    assert b0.weight == 2.0 and b0.throttle_share == 1.0 and b0.verdict(10.0) is Verdict.HEALTHY


def test_each_expiry_counts_once_and_the_next_reading_judges_the_backend_again() -> None:
    pool, (b0, b1) = pool_of()
    watch = GpuWatch(GpuSettings(stale_after_s=5.0, clean_for_s=30.0), pool)
    assert list(watch.expiries()) == [(b0, 0), (b1, 0)]  # from the start, agent or none
    watch.record(b0, [CLEAN], now=0.0)
    assert [e.state for e in watch.expire(now=5.0)] == ["stale"]  # ok, then stale: counted
    assert watch.expire(now=6.0) == [] and watch.expire(now=60.0) == []  # still the same one
    assert list(watch.expiries()) == [(b0, 1), (b1, 0)]
    back = watch.record(b0, [reading(xid_errors=[79])], now=61.0)  # the agent is back: a fault
    assert back is not None and back.state == "fault" and pool.candidates == (b1,)
    assert [e.state for e in watch.expire(now=66.0)] == ["stale"]
    assert pool.candidates == (b0, b1)
    assert list(watch.expiries()) == [(b0, 2), (b1, 0)]
    again = watch.record(b0, [CLEAN], now=70.0)  # clean: ok at once, as nothing holds it out
    assert again is not None and again.state == "ok" and not b0.flags


def test_the_board_checks_ages_often_enough_for_its_shortest_time_to_live() -> None:
    pool_a, _ = pool_of()
    pool_b, _ = pool_of()
    board = GpuBoard(lambda: 0.0)
    assert board.expire_every_s == 1.0
    board.watch(GpuWatch(GpuSettings(), pool_a))  # 15 s: every second
    assert board.expire_every_s == 1.0
    board.watch(GpuWatch(GpuSettings(stale_after_s=2.0), pool_b))
    assert board.expire_every_s == 0.5
    assert [(model, s.backend.id, n) for model, s, n in board.expiries()] == [
        ("m", "b0", 0), ("m", "b1", 0), ("m", "b0", 0), ("m", "b1", 0),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="stale_after_s"):
        GpuSettings(stale_after_s=0)
