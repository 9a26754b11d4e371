"""`fleetgate simulate --compare`: one scenario under several gateway configs, each run in its
own process, printed side by side as `fleetgate bench --compare` prints saved runs; every
config sees the same requests, each column is what a single run with that config gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetgate.cli import main
from fleetgate.simulate.command import report
from fleetgate.simulate.compare import with_policy
from fleetgate.simulate.run import simulate
from fleetgate.simulate.scenario import parse_scenario


def scenario_data(**changes: Any) -> dict[str, Any]:
    """Three H100s under Azure's conversations sped up enough to queue."""
    return {
        "name": "busy",
        "regions": [{"name": "east", "pools": [{"model": "m", "replicas": 3}]}],
        "workload": {"name": "azure-conv", "max_requests": 200, "speed": 40.0},
        "gateway": {"pools": [{"model": "m"}]},
        "slo": {"ttft_ms": 500},
        **changes,
    }


def write(path: Path, data: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def summary_of(folder: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((folder / "summary.json").read_text())["summary"]
    return summary


def test_two_policies_see_the_same_requests_and_route_them_differently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the tables unwrapped
    path = write(tmp_path / "s.yaml", scenario_data())
    out = tmp_path / "out"
    args = ["--compare", "policy:round_robin", "policy:least_requests", "--out", str(out)]
    assert main(["simulate", "--scenario", path, *args]) == 0
    said = capsys.readouterr().out
    assert "busy: all clients (ratios to the first)" in said
    assert "policy:round_robin" in said and "simulated 2 configs of 200 requests" in said
    assert "policy:least_requests: " in said and " GPU-hours" in said
    rr, lr = summary_of(out / "policy-round_robin"), summary_of(out / "policy-least_requests")
    # The workload is the scenario's for both; what routing decides is not.
    assert rr["requests"] == lr["requests"] == 200
    assert rr["ttft_ms"] != lr["ttft_ms"]
    assert rr["slo_attainment"] != lr["slo_attainment"]
    # Each column is the single run with that policy, to the last digit.
    for policy, saved in (("round_robin", rr), ("least_requests", lr)):
        alone = parse_scenario(scenario_data(gateway={"pools": [{"model": "m", "policy": policy}]}))
        summary = report(alone, simulate(alone))["all clients"]
        assert summary.ttft_ms is not None and saved["ttft_ms"]["p90"] == summary.ttft_ms.p90
        assert saved["slo_attainment"] == summary.slo_attainment
    assert len((out / "policy-round_robin" / "requests.jsonl").read_text().splitlines()) == 200
    assert "policy:least_requests" in (out / "comparison.txt").read_text()
    # The sub-folders are saved runs as `fleetgate bench --out` writes them.
    folders = [str(out / "policy-round_robin"), str(out / "policy-least_requests")]
    assert main(["bench", "--compare", *folders]) == 0
    assert "busy under policy:least_requests" in capsys.readouterr().out


def test_a_config_file_is_a_gateway_config_whose_backends_are_the_replicas(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "s.yaml", scenario_data())
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    gateway = {"pools": [{"model": "m", "policy": "least_requests",
                          "backends": [{"url": "http://elsewhere:8000"}]}]}  # fmt: skip
    first, second = write(tmp_path / "a" / "lr.yaml", gateway), write(tmp_path / "b" / "lr.yaml", {
        "pools": [{"model": "m", "policy": "round_robin"}]})  # fmt: skip
    out = tmp_path / "out"
    args = ["--compare", first, "policy:least_requests", second, "--out", str(out)]
    assert main(["simulate", "--scenario", path, *args]) == 0
    # Two files of one name get two folders; the file and the shorthand are one config.
    assert summary_of(out / "lr") == summary_of(out / "policy-least_requests")
    assert summary_of(out / "lr-2") != summary_of(out / "lr")
    assert summary_of(out / "lr")["completed"] == 200  # served by the scenario's replicas


def test_policy_shorthand_replaces_each_pools_routing() -> None:
    gateway = {"server": {"port": 1}, "pools": [
        {"model": "m", "policy": "prefix_cache", "policy_params": {"block_bytes": 64}},
        {"model": "n", "routing": {"picker": "max_score"}},
    ]}  # fmt: skip
    routed = [{"model": "m", "policy": "round_robin"}, {"model": "n", "policy": "round_robin"}]
    assert with_policy(gateway, "round_robin") == {"server": {"port": 1}, "pools": routed}


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        (["missing.yaml"], "cannot read config"),
        (["policy:nope"], "unknown routing policy 'nope'"),
        (["bad.yaml"], "bad.yaml: Unknown key: unknown field `polcy`"),
        (["list.yaml"], "a gateway config is a mapping"),
        (["unknown-policy.yaml"], "unknown routing policy 'nope'"),
    ],
)
def test_a_wrong_config_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], configs: list[str], message: str
) -> None:
    path = write(tmp_path / "s.yaml", scenario_data())
    write(tmp_path / "bad.yaml", {"pools": [{"model": "m", "polcy": "x"}]})
    (tmp_path / "list.yaml").write_text("- pools\n")
    write(tmp_path / "unknown-policy.yaml", {"pools": [{"model": "m", "policy": "nope"}]})
    given = [str(tmp_path / c) if c.endswith(".yaml") else c for c in configs]
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", path, "--compare", *given, "--out", str(out)]) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not out.exists()


def test_compare_and_find_replicas_together_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "s.yaml", scenario_data())
    args = ["--compare", "policy:round_robin", "--find-replicas", "m"]
    assert main(["simulate", "--scenario", path, *args]) == 2
    assert "--compare and --find-replicas" in capsys.readouterr().err
