"""`benchmarks/routing.py --sim`'s runs (benchmarks/routing_sim.py): a shipped trace's rate is
read whole, and a policy's run over a grown fleet answers every request it sends."""

from __future__ import annotations

from pathlib import Path

from benchmarks import routing_sim
from fleetgate.bench.stats import Slo


def test_a_trace_s_rate_is_its_whole_hour_s() -> None:
    assert abs(routing_sim.trace_rate("mooncake-conv") - 12_031 / 3_540) < 0.01


def test_a_policy_runs_over_a_fleet_grown_from_the_live_one(tmp_path: Path) -> None:
    scenario = routing_sim.scenario(
        fleet=[("h100-llama3-8b", 8)], bench="--workload mooncake-conv --rate 2",
        model="llama-3.1-8b", policy="least_requests", replicas=16, duration_s=10.0,
        slo=Slo(ttft_ms=2000, itl_ms=200),
    )  # fmt: skip
    pools = scenario.regions[0].pools
    assert [(p.profile, p.replicas) for p in pools] == [("h100-llama3-8b", 16)]
    result = routing_sim.run(scenario, Slo(ttft_ms=1000, itl_ms=200), tmp_path)
    summary = result["summary"]
    assert summary["requests"] > 100 and summary["errors"] == {}
    assert (tmp_path / "summary.json").exists() and (tmp_path / "requests.jsonl").exists()
