"""Traffic surges (simulate/warp.py): the workload's clock runs faster during a surge, then at
its own pace again from where the surge left it."""

from __future__ import annotations

import pytest

from fleetgate.simulate.warp import Warp


def test_without_surges_the_workload_keeps_its_times() -> None:
    warp = Warp([])
    assert [warp.at(t) for t in (0.0, 5.0, 100.0)] == [0.0, 5.0, 100.0]


def test_a_surge_plays_the_workload_faster_then_at_its_own_pace() -> None:
    warp = Warp(iter([(10.0, 5.0, 3.0)]))  # 15 s of workload in 5 s from t=10 (once read)
    assert warp.at(10.0) == 10.0
    assert warp.at(13.0) == pytest.approx(11.0)
    assert warp.at(25.0) == pytest.approx(15.0)  # the surge's end
    assert warp.at(35.0) == pytest.approx(25.0)  # 10 s on, at the usual pace


def test_overlapping_surges_multiply() -> None:
    warp = Warp([(0.0, 10.0, 2.0), (5.0, 10.0, 2.0)])
    # 0-5 at 2x (10 s), 5-10 at 4x (20 s), 10-15 at 2x (10 s): 40 s of workload by t=15.
    assert warp.at(10.0) == pytest.approx(5.0)
    assert warp.at(30.0) == pytest.approx(10.0)
    assert warp.at(40.0) == pytest.approx(15.0)


def test_how_much_of_the_workload_a_surge_has_played_by_a_time() -> None:
    warp = Warp([(10.0, 5.0, 3.0)])
    assert [warp.played(t) for t in (5.0, 12.0, 15.0, 20.0)] == [5.0, 16.0, 25.0, 30.0]
    assert all(warp.at(warp.played(t)) == pytest.approx(t) for t in (3.0, 11.0, 40.0))
