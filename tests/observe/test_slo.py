"""Objectives and burn rates (observe/slo.py), fed Finished events at chosen times."""

from __future__ import annotations

import msgspec
import pytest

from fleetgate.lifecycle.events import Finished, Outcome
from fleetgate.observe.slo import SloBook, SloSettings, burn_alerts, window_label


def finished(
    at: float,
    *,
    e2e: float = 1.0,
    ttft: float | None = 0.1,
    status: int = 200,
    outcome: Outcome = "answered",
    model: str = "m",
    tokens: int | None = None,
) -> Finished:
    return Finished(b"r", at, model, at - e2e, status, "b", outcome, ttft, tokens)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def book(clock: Clock, **objectives: float) -> SloBook:
    return SloBook({"m": SloSettings(**objectives)}, clock)  # type: ignore[arg-type]


def test_a_p99_objective_met_at_one_slow_stream_in_a_hundred_and_not_at_two() -> None:
    clock = Clock()
    slo = book(clock, ttft_s=2.0)
    for i in range(200):
        slo.on_finished(finished(i * 1.0, ttft=3.0 if i in (10, 110) else 0.5))
    clock.now = 199.0
    (status,) = slo.status()["m"]
    assert (status.name, status.requests, status.value, status.met) == ("ttft_p99", 200, 0.99, True)
    assert status.burn["5m"] == pytest.approx(1.0)  # spends the budget in exactly its period
    slo.on_finished(finished(199.5, ttft=2.5))
    assert slo.status()["m"][0].met  # worked out once a second: the same second's figures
    clock.now = 200.0
    (status,) = slo.status()["m"]
    assert status.met is False
    assert status.burn["5m"] == pytest.approx(3 / 201 / 0.01)
    assert (status.good_total, status.bad_total) == (198, 3)


def test_requests_without_a_first_token_are_not_judged_by_the_ttft_objective() -> None:
    clock = Clock()
    slo = book(clock, ttft_s=1.0)
    slo.on_finished(finished(1.0, ttft=None))  # a whole (not streamed) answer
    (status,) = slo.status()["m"]
    assert (status.requests, status.value, status.met) == (0, None, True)


def test_the_tpot_objective_judges_whole_streams_by_their_time_per_token_after_the_first() -> None:
    clock = Clock()
    slo = book(clock, tpot_s=0.2, tpot_percentile=50)
    slo.on_finished(finished(1.0, e2e=2.1, ttft=0.1, tokens=11))  # 2.0 s / 10 gaps: met
    slo.on_finished(finished(2.0, e2e=2.2, ttft=0.1, tokens=11))  # 0.21 s a token: not met
    slo.on_finished(finished(3.0, e2e=9.0, ttft=0.1, tokens=1))  # no gap to judge
    slo.on_finished(finished(4.0, e2e=9.0, ttft=None, tokens=None))  # a whole answer
    slo.on_finished(finished(5.0, e2e=9.0, ttft=0.1, tokens=40, status=502, outcome="failed"))
    clock.now = 6.0
    (status,) = slo.status()["m"]
    assert (status.name, status.requests, status.value, status.met) == ("tpot_p50", 2, 0.5, True)
    with pytest.raises(msgspec.ValidationError, match="tpot_s"):
        msgspec.convert({"tpot_s": 0}, SloSettings)
    with pytest.raises(msgspec.ValidationError, match="tpot_percentile"):
        msgspec.convert({"tpot_s": 0.1, "tpot_percentile": 101}, SloSettings)


def test_the_page_alert_fires_when_a_long_and_a_short_window_both_burn_fast() -> None:
    clock = Clock()
    slo = book(clock, availability=0.99)
    for second in range(3300):  # 55 minutes of good answers, one a second
        slo.on_finished(finished(float(second)))
    for second in range(3300, 3600):  # then 5 minutes of nothing but 502s
        slo.on_finished(finished(float(second), status=502, outcome="failed"))
    clock.now = 3599.0
    (status,) = slo.status()["m"]
    # 1 h: 300 bad in 3,600 (8.3x, under 14.4); 6 h: the same; 30 min: 300 in 1,800 (16.7x).
    assert status.burn["1h"] == pytest.approx(300 / 3600 / 0.01)
    assert status.burn["5m"] == pytest.approx(100.0)
    assert status.burn["30m"] == pytest.approx(300 / 1800 / 0.01)
    assert status.alerts == ["page", "ticket"]  # 6h and 30m over 6; 24h and 2h over 3
    clock.now = 3599.0 + 3 * 3600  # three quiet hours: the short windows are empty again
    (status,) = slo.status()["m"]
    assert status.alerts == []
    assert (status.burn["5m"], status.value, status.met) == (0.0, None, True)


def test_availability_counts_5xx_and_shed_requests_but_not_the_clients_own_errors() -> None:
    clock = Clock()
    slo = book(clock, availability=0.9)
    slo.on_finished(finished(1.0))
    slo.on_finished(finished(1.0, status=503, outcome="rejected"))  # shed: the service's fault
    slo.on_finished(finished(1.0, status=504, outcome="failed"))
    slo.on_finished(finished(1.0, status=429, outcome="rejected"))  # its own rate limit
    slo.on_finished(finished(1.0, status=400, outcome="rejected"))
    slo.on_finished(finished(1.0, status=499, outcome="client_closed"))
    (status,) = slo.status()["m"]
    assert (status.requests, status.value) == (3, pytest.approx(1 / 3))


def test_a_mean_objective_is_the_mean_over_its_window_of_whole_answers() -> None:
    clock = Clock()
    slo = book(clock, mean_e2e_s=10.0, window_s=60.0)
    slo.on_finished(finished(0.0, e2e=30.0))  # out of the window by the time it is read
    clock.now = 100.0
    slo.on_finished(finished(90.0, e2e=8.0))
    slo.on_finished(finished(95.0, e2e=14.0))
    slo.on_finished(finished(95.0, e2e=99.0, status=504, outcome="failed"))  # no answer
    (status,) = slo.status()["m"]
    assert (status.kind, status.value, status.requests, status.met) == ("mean", 11.0, 2, False)
    assert status.burn == {"1m": pytest.approx(1.1)}


def test_every_objective_of_a_pool_is_reported_and_other_pools_events_are_ignored() -> None:
    clock = Clock()
    slo = SloBook(
        {"m": SloSettings(ttft_s=2.0, e2e_s=20.0, e2e_percentile=95, availability=0.999,
                          mean_e2e_s=10.0),
         "quiet": SloSettings()},
        clock,
    )  # fmt: skip
    slo.on_finished(finished(1.0, model="other"))
    slo.on_finished(finished(1.0, model=""))  # refused before its pool was known
    assert list(slo.status()) == ["m"]  # a pool without objectives has no entry
    names = [o.name for o in slo.status()["m"]]
    assert names == ["ttft_p99", "e2e_p95", "availability", "mean_e2e"]
    assert all(o.requests == 0 for o in slo.status()["m"])


def test_burn_windows_scale_with_the_budgets_period() -> None:
    (page_fast, page_slow, ticket) = burn_alerts(7.0)
    assert (page_fast.long_s, page_fast.short_s) == pytest.approx((3600 * 7 / 30, 300 * 7 / 30))
    assert (ticket.factor, page_slow.factor) == (3.0, 6.0)
    assert [window_label(s) for s in (300, 3600, 86400, 90, 12.5)] == [
        "5m", "1h", "1d", "90s", "12.5s"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ttft_s": 0}, "ttft_s"),
        ({"ttft_s": 1, "ttft_percentile": 100}, "no error budget"),
        ({"availability": 1.0}, "no error budget"),
        ({"availability": 1.5}, "availability"),
        ({"window_s": 90_000}, "30th of `period_days`"),
        ({"period_days": 0}, "period_days"),
        ({"p99_ttft": 2}, "unknown field"),
    ],
)
def test_bad_objectives_are_refused_by_name(fields: dict[str, float], message: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=message):
        msgspec.convert(fields, SloSettings)
