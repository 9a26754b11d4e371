"""`fleetgate simulate --find-replicas`: the fewest replicas of a pool whose SLO attainment
reaches the target, found by doubling then bisection, probing several counts at once; a count
is split over the regions as the scenario splits the pool."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetgate.cli import main
from fleetgate.simulate.capacity import (
    MAX_REPLICAS,
    Measure,
    smallest_meeting,
    split,
    with_replicas,
)
from fleetgate.simulate.command import report
from fleetgate.simulate.run import simulate
from fleetgate.simulate.scenario import parse_scenario


def scenario_data(replicas: int = 4, **changes: Any) -> dict[str, Any]:
    """H100s under Azure's conversations sped up until four of them queue past 500 ms."""
    return {
        "name": "busy",
        "regions": [{"name": "east", "pools": [{"model": "m", "replicas": replicas}]}],
        "workload": {"name": "azure-conv", "max_requests": 300, "speed": 40.0},
        "gateway": {"pools": [{"model": "m"}]},
        "slo": {"ttft_ms": 500},
        **changes,
    }


@cache
def attainment(replicas: int) -> float:
    """The SLO attainment of `scenario_data(replicas)`, run here."""
    s = parse_scenario(scenario_data(replicas))
    value = report(s, simulate(s))["all clients"].slo_attainment
    assert value is not None
    return value


@pytest.mark.parametrize(
    "slo",
    [
        [],  # the scenario's
        ["--slo-ttft-ms", "500", "--slo-itl-ms", "1000"],  # the flags', over another
    ],
)
def test_the_count_found_meets_the_target_and_one_fewer_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], slo: list[str]
) -> None:
    data = scenario_data(slo={"ttft_ms": 20000}) if slo else scenario_data()
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    args = ["--find-replicas", "m", "--target", "0.99", "--out", str(out), *slo]
    assert main(["simulate", "--scenario", str(path), *args]) == 0
    said = capsys.readouterr().out
    line = re.search(r"m needs (\d+) replicas \(attainment ([\d.]+) at \1, ([\d.]+) at (\d+)\)",
                     said)  # fmt: skip
    assert line is not None, said
    found = int(line[1])
    assert int(line[4]) == found - 1
    assert attainment(found) >= 0.99 > attainment(found - 1)
    assert float(line[2]) == pytest.approx(attainment(found), abs=1e-4)
    curve = json.loads((out / "replicas.json").read_text())
    assert curve["replicas"] == found
    assert curve["slo"] == {"ttft_ms": 500, "itl_ms": 1000 if slo else None}
    by_count = {p["replicas"]: p for p in curve["curve"]}
    assert by_count[found - 1]["slo_attainment"] == attainment(found - 1)
    assert [p["replicas"] for p in curve["curve"]] == sorted(by_count)
    assert "TTFT p90 (ms)" in said


def step(answer: int, rounds: list[Sequence[int]]) -> Measure:
    """Attainment that reaches the target at `answer` replicas; each round kept."""

    def measure(counts: Sequence[int]) -> dict[int, float]:
        rounds.append(counts)
        return {c: 0.995 if c >= answer else 0.5 for c in counts}

    return measure


def test_the_search_finds_the_smallest_count_probing_a_round_at_once() -> None:
    for width in (1, 2, 3, 4):
        for start in (1, 4, 16, 40):
            for answer in (1, 2, 5, 9, 16, 17, 100):
                rounds: list[Sequence[int]] = []
                found = smallest_meeting(step(answer, rounds), target=0.99, start=start,
                                         width=width)  # fmt: skip
                assert found == answer, (width, start, answer, rounds)
                assert all(1 <= len(r) <= width for r in rounds)
                assert len(rounds) <= 2 * (max(answer, start).bit_length() + 2)


def test_the_search_gives_up_where_no_count_meets_the_target() -> None:
    probed: list[int] = []

    def measure(counts: Sequence[int]) -> dict[int, float]:
        probed.extend(counts)
        return dict.fromkeys(counts, 0.9)

    assert smallest_meeting(measure, target=0.99, start=3, width=2) is None
    assert max(probed) == MAX_REPLICAS


def test_a_count_is_split_in_the_scenarios_proportions() -> None:
    assert split([4, 2], 6) == [4, 2]
    assert split([4, 2], 3) == [2, 1]
    assert split([4, 2], 1) == [1, 0]
    assert split([1, 1, 1], 4) == [2, 1, 1]  # a tie: the earlier first
    assert split([0, 0], 3) == [2, 1]  # none yet: evenly
    assert split([5], 9) == [9]
    for total in range(40):
        assert sum(split([7, 3, 1], total)) == total
    two = parse_scenario(scenario_data(regions=[
        {"name": "east", "pools": [{"model": "m", "replicas": 4}, {"model": "e", "replicas": 1}]},
        {"name": "west", "gateways": 0, "pools": [{"model": "m", "replicas": 2}]},
    ], gateway={"pools": [{"model": "m"}, {"model": "e"}]}))  # fmt: skip
    grown = with_replicas(two, "m", 9)
    assert [[(p.model, p.replicas) for p in r.pools] for r in grown.regions] == [
        [("m", 6), ("e", 1)], [("m", 3)]]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--find-replicas", "x"], "no pool 'x'"),
        (["--find-replicas", "m", "--target", "0"], "--target is a share of requests in (0, 1]"),
        (["--find-replicas", "m", "--target", "1.5"], "in (0, 1], got 1.5"),
        (["--find-replicas", "m", "--target", "nan"], "in (0, 1], got nan"),
        (["--find-replicas", "m", "--slo-ttft-ms", "-5"], "--slo-ttft-ms must be"),
    ],
)
def test_bad_input_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario_data()))
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", str(path), *args, "--out", str(out)]) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not out.exists()


def test_a_scenario_without_an_slo_needs_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario_data(slo={})))
    assert main(["simulate", "--scenario", str(path), "--find-replicas", "m"]) == 2
    assert "needs an SLO" in capsys.readouterr().err
