"""Outlier ejection with an injected clock: growth, cap, share limit, half-open return."""

from __future__ import annotations

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.health import HealthFlag
from fleetgate.health.outlier import OutlierDetector, OutlierSettings

SETTINGS = OutlierSettings(
    consecutive_failures=3, base_ejection_s=10.0, max_ejection_s=25.0, max_ejected_share=0.5
)


def states(n: int) -> list[BackendState]:
    return [
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{9000 + i}", ("m",))) for i in range(n)
    ]


def eject(detector: OutlierDetector, state: BackendState, now: float) -> bool:
    ejected = False
    for _ in range(SETTINGS.consecutive_failures):  # every failure counts: no short cut
        ejected |= detector.failure(state, now)
    return ejected


def test_consecutive_failures_eject_and_a_success_resets_the_count() -> None:
    a, _ = states(2)
    detector = OutlierDetector(SETTINGS, 2)
    assert not detector.failure(a, 0.0)
    assert not detector.failure(a, 0.0)
    detector.success(a, 0.0)
    assert not detector.failure(a, 0.0)
    assert not detector.failure(a, 0.0)
    assert detector.failure(a, 0.0)
    assert a.flags == HealthFlag.EJECTED


def test_ejection_time_grows_with_each_ejection_and_is_capped() -> None:
    a, _ = states(2)
    detector = OutlierDetector(SETTINGS, 2)
    now, durations = 0.0, []
    for _ in range(4):
        assert eject(detector, a, now)
        back = detector.next_return()
        durations.append(back - now)
        assert detector.return_due(back - 0.001) == []
        assert detector.return_due(back) == [a]
        assert not a.flags
        now = back
    assert durations == [10.0, 20.0, 25.0, 25.0]


def test_a_returning_backend_is_half_open_its_first_failure_ejects_it_again() -> None:
    a, _ = states(2)
    detector = OutlierDetector(SETTINGS, 2)
    eject(detector, a, 0.0)
    detector.return_due(10.0)
    assert detector.failure(a, 11.0)  # one failure is enough while half-open
    detector.return_due(detector.next_return())
    detector.success(a, 40.0)  # closed again: back to needing consecutive failures
    assert not detector.failure(a, 41.0)


def test_at_most_the_configured_share_is_ejected_at_once() -> None:
    pool = states(4)
    detector = OutlierDetector(SETTINGS, 4)
    assert eject(detector, pool[0], 0.0)
    assert eject(detector, pool[1], 0.0)
    assert not eject(detector, pool[2], 0.0)  # 3 of 4 would be over half
    assert not pool[2].flags


def test_good_behaviour_forgives_past_ejections() -> None:
    a, _ = states(2)
    detector = OutlierDetector(SETTINGS, 2)
    eject(detector, a, 0.0)
    detector.return_due(10.0)
    detector.success(a, 11.0)
    assert detector.ejections(a) == 1
    detector.success(a, 10.0 + SETTINGS.max_ejection_s + 1)
    assert detector.ejections(a) == 0
