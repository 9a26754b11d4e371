"""Outlier ejection with an injected clock: growth, cap, share limit, half-open return, and
the rule of what an attempt's end says of its backend."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.calibration import WeightSettings
from fleetgate.fleet.health import HealthFlag, HealthSettings
from fleetgate.fleet.pool import Pool
from fleetgate.health.outlier import OutlierDetector, OutlierSettings
from fleetgate.lifecycle.events import AttemptEnded, Ejected, ErrorKind

SETTINGS = OutlierSettings(
    consecutive_failures=3, base_ejection_s=10.0, max_ejection_s=25.0, max_ejected_share=0.5
)


def states(n: int) -> list[BackendState]:
    return [
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{9000 + i}", ("m",))) for i in range(n)
    ]


def detector_over(pool_states: list[BackendState]) -> tuple[OutlierDetector, Pool]:
    """A detector over a pool of these states. No slow start and no calibration, so the pool's
    `next_check` is when the next ejected backend is due back."""
    pool = Pool("m", pool_states, HealthSettings(slow_start_s=0.0), WeightSettings(calibrate=False))
    return OutlierDetector(SETTINGS, pool), pool


def eject(detector: OutlierDetector, state: BackendState, now: float) -> bool:
    ejected = False
    for _ in range(SETTINGS.consecutive_failures):  # every failure counts: no short cut
        ejected |= detector.failure(state, now)
    return ejected


def ended(
    state: BackendState,
    at: float,
    status: int = 200,
    error: ErrorKind | None = None,
    retry_after_s: float | None = None,
) -> AttemptEnded:
    """The end of an attempt at `state`: the backend's status (0: none came) and error."""
    return AttemptEnded(
        b"r", at, "m", state.backend.id, "first", sent_at=at, prompt_tokens=1, queued_prefill=0,
        status=status, error=error, retry_after_s=retry_after_s, first_token_at=None,
        output_tokens=0, stream=False,
    )  # fmt: skip


def test_consecutive_failures_eject_and_a_success_resets_the_count() -> None:
    a, b = states(2)
    detector, pool = detector_over([a, b])
    assert not detector.failure(a, 0.0)
    assert not detector.failure(a, 0.0)
    detector.success(a, 0.0)
    assert not detector.failure(a, 0.0)
    assert not detector.failure(a, 0.0)
    assert detector.failure(a, 0.0)
    assert a.flags == HealthFlag.EJECTED
    assert (pool.candidates, pool.ejected) == ((b,), 1)  # ejected through the pool


def test_ejection_time_grows_with_each_ejection_and_is_capped() -> None:
    a, b = states(2)
    detector, pool = detector_over([a, b])
    now, durations = 0.0, []
    for _ in range(4):
        assert eject(detector, a, now)
        back = pool.next_check
        durations.append(back - now)
        pool.update(back - 0.001)
        assert a.flags == HealthFlag.EJECTED  # not due yet
        pool.update(back)
        assert not a.flags
        assert (pool.ejected, a in pool.candidates) == (0, True)
        now = back
    assert durations == [10.0, 20.0, 25.0, 25.0]


def test_a_returning_backend_is_half_open_its_first_failure_ejects_it_again() -> None:
    a, b = states(2)
    detector, pool = detector_over([a, b])
    eject(detector, a, 0.0)
    pool.update(10.0)
    assert not a.flags
    assert detector.failure(a, 11.0)  # one failure is enough while half-open
    pool.update(pool.next_check)
    detector.success(a, 40.0)  # closed again: back to needing consecutive failures
    assert not detector.failure(a, 41.0)


def test_an_answer_arriving_while_ejected_leaves_the_return_half_open() -> None:
    a, b = states(2)
    detector, pool = detector_over([a, b])
    eject(detector, a, 0.0)
    detector.success(a, 5.0)  # a request sent before the ejection came back fine
    assert a.flags == HealthFlag.EJECTED
    pool.update(10.0)
    assert detector.failure(a, 11.0)  # still half-open on its return


def test_at_most_the_configured_share_is_ejected_at_once() -> None:
    four = states(4)
    detector, pool = detector_over(four)
    assert eject(detector, four[0], 0.0)
    assert eject(detector, four[1], 0.0)
    assert not eject(detector, four[2], 0.0)  # 3 of 4 would be over half
    assert not four[2].flags
    assert pool.ejected == 2


def test_good_behaviour_forgives_past_ejections() -> None:
    a, b = states(2)
    detector, pool = detector_over([a, b])
    eject(detector, a, 0.0)
    pool.update(10.0)
    detector.success(a, 11.0)
    assert detector.ejections(a) == 1
    detector.success(a, 10.0 + SETTINGS.max_ejection_s + 1)
    assert detector.ejections(a) == 0


# -- what an attempt's end counts for (on_attempt_ended) -------------------------------------


@pytest.mark.parametrize(
    ("status", "error"),
    [(500, None), (502, None), (503, None), (504, None), (0, "connect"), (0, "read"),
     (200, "protocol"), (0, "timeout"), (200, "timeout")],
)  # fmt: skip
def test_errors_and_5xx_are_the_backends_failures(status: int, error: ErrorKind | None) -> None:
    a, b = states(2)
    detector, pool = detector_over([a, b])
    for _ in range(SETTINGS.consecutive_failures - 1):
        detector.on_attempt_ended(ended(a, 1.0, status, error))
    assert not a.flags
    detector.on_attempt_ended(ended(a, 1.0, status, error))
    assert a.flags == HealthFlag.EJECTED
    assert a not in pool.candidates
    assert detector.ejections(a) == 1


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
def test_a_client_caused_4xx_never_ejects_and_counts_as_a_success(status: int) -> None:
    a, b = states(2)
    detector, pool = detector_over([a, b])
    for t in range(50):  # past the failure rate's min_requests, too
        detector.on_attempt_ended(ended(a, t * 0.1, status))
    assert not a.flags
    assert (detector.ejections(a), a in pool.candidates) == (0, True)
    # It is an answer: it breaks a run of failures as a success does.
    for _ in range(SETTINGS.consecutive_failures - 1):
        detector.on_attempt_ended(ended(a, 6.0, 500))
    detector.on_attempt_ended(ended(a, 6.0, status))
    detector.on_attempt_ended(ended(a, 6.0, 500))
    assert not a.flags


@pytest.mark.parametrize(
    ("status", "retry_after_s", "backoff_s"), [(429, 2.0, 2.0), (429, None, 1.0), (503, 3.0, 3.0)]
)
def test_backpressure_backs_off_without_counting_as_a_failure(
    status: int, retry_after_s: float | None, backoff_s: float
) -> None:
    a, b = states(2)
    detector, pool = detector_over([a, b])
    for _ in range(2 * SETTINGS.consecutive_failures):
        detector.on_attempt_ended(ended(a, 1.0, status, retry_after_s=retry_after_s))
    assert a.backoff_until == 1.0 + backoff_s
    assert a not in pool.candidates  # skipped until then ...
    assert not a.flags  # ... but healthy: not ejected
    assert detector.ejections(a) == 0
    # Had those counted as failures, this one would be over the limit.
    assert not detector.failure(a, 1.5)
    pool.update(1.0 + backoff_s)
    assert a in pool.candidates


@pytest.mark.parametrize("error", ["cancelled", "gateway", "client_timeout", "local_resources"])
def test_what_the_gateway_or_its_client_ended_counts_for_nothing(error: ErrorKind) -> None:
    a, b = states(2)
    detector, _ = detector_over([a, b])
    for _ in range(2 * SETTINGS.consecutive_failures):  # not failures ...
        detector.on_attempt_ended(ended(a, 1.0, 0, error))
        detector.on_attempt_ended(ended(a, 1.0, 200, error))
    assert not a.flags
    assert a.backoff_until == 0.0
    for _ in range(SETTINGS.consecutive_failures - 1):
        detector.on_attempt_ended(ended(a, 2.0, 500))
    detector.on_attempt_ended(ended(a, 2.0, 200, error))  # ... nor a success
    detector.on_attempt_ended(ended(a, 2.0, 500))
    assert a.flags == HealthFlag.EJECTED


def test_a_5xx_two_backends_give_one_request_is_the_request_s_fault() -> None:
    a, b, c = states(3)
    detector, _ = detector_over([a, b, c])
    for t in range(2 * SETTINGS.consecutive_failures):  # a poison body, sent again and again
        first, second = (a, b) if t % 2 else (b, a)
        detector.on_attempt_ended(ended(first, float(t), 500))
        detector.on_attempt_ended(replace(ended(second, float(t), 500), prior_status=500,
                                          prior_backend=first.backend.id))  # fmt: skip
    assert not a.flags and not b.flags
    # The failure counted for the first was taken back: a backend's own run still counts.
    for _ in range(SETTINGS.consecutive_failures):
        detector.on_attempt_ended(ended(c, 30.0, 500))
    assert c.flags == HealthFlag.EJECTED


@pytest.mark.parametrize("prior_status", [0, 502])
def test_a_5xx_unlike_the_previous_attempt_s_is_the_backend_s(prior_status: int) -> None:
    a, b = states(2)
    detector, _ = detector_over([a, b])
    for _ in range(SETTINGS.consecutive_failures):
        detector.on_attempt_ended(replace(ended(a, 1.0, 500), prior_status=prior_status,
                                          prior_backend=b.backend.id))  # fmt: skip
    assert a.flags == HealthFlag.EJECTED


def test_each_ejection_is_told_with_the_rule_that_fired_and_the_failing_request() -> None:
    a, b, c, d = states(4)
    detector, pool = detector_over([a, b, c, d])
    told: list[Ejected] = []
    detector.on_ejected = told.append
    eject(detector, a, 0.0)
    pool.update(10.0)
    assert detector.failure(a, 11.0, b"r-2")  # its first failure on its return
    rated = replace(SETTINGS, consecutive_failures=100, min_requests=4, failure_rate=0.5)
    detector = OutlierDetector(rated, detector_over([a, b, c, d])[1])
    detector.on_ejected = told.append
    for now, failed in ((20.0, False), (20.1, True), (20.2, False), (20.3, True)):
        if failed:
            detector.failure(b, now, b"r-3")
        else:
            detector.success(b, now)
    assert [(e.backend, e.reason, e.request_id, e.until) for e in told] == [
        (a.backend.id, "consecutive_failures", b"", 10.0),
        (a.backend.id, "half_open", b"r-2", 31.0),
        (b.backend.id, "failure_rate", b"r-3", 30.3),
    ]
    assert {e.model for e in told} == {"m"}


def test_a_backend_leaving_its_pool_is_never_ejected_and_holds_no_ejected_place() -> None:
    a, b, c, d, e = states(5)
    detector, pool = detector_over([a, b, c, d, e])
    for _ in range(5):
        pool.begin(a.backend.id, 0.0)
    pool.retire(a, 0.0)  # the operator removed it; its last requests fail as it goes
    assert not eject(detector, a, 1.0)
    assert pool.ejected == 0
    assert eject(detector, b, 2.0) and eject(detector, c, 2.0)  # two of five: both may go
