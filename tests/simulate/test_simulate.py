"""`fleetgate simulate`: a scenario's gateway (serve.compose's, unchanged) over simulated
engines in virtual time: every request answered, the same seed the same run, replicas that
crash failed over, a scenario that is wrong refused with what to change."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetgate.cli import main
from fleetgate.config import ConfigError
from fleetgate.simulate.report import gpu_hours
from fleetgate.simulate.run import Outcome, simulate
from fleetgate.simulate.scenario import Scenario, gateway_config, parse_scenario, replicas


def scenario(**changes: Any) -> Scenario:
    """Two regions' worth of a small fleet: 4 H100s here, 2 there, Azure's conversations."""
    data: dict[str, Any] = {
        "name": "small",
        "regions": [
            {"name": "east", "zones": ["a", "b"],
             "pools": [{"model": "m", "profile": "h100-llama3-8b", "replicas": 4}]},
            {"name": "west", "gateways": 0,
             "pools": [{"model": "m", "profile": "h100-llama3-8b", "replicas": 2}]},
        ],
        "latency_ms": {"east": {"west": 30}},
        "workload": {"name": "azure-conv", "max_requests": 300, "speed": 4.0},
        "gateway": {"pools": [{"model": "m"}]},
        "slo": {"ttft_ms": 2000, "itl_ms": 200},
        **changes,
    }  # fmt: skip
    return parse_scenario(data)


def test_every_request_is_answered_through_the_gateway() -> None:
    outcome = simulate(scenario())
    assert len(outcome.records) == 300
    assert all(r.ok for r in outcome.records), {r.error for r in outcome.records}
    assert [r.index for r in outcome.records] == list(range(300))
    record = outcome.records[0]
    assert record.ttft_s is not None and 0 < record.ttft_s < record.e2e_s  # type: ignore[operator]
    assert record.tpot_s is not None and record.tpot_s > 0
    assert outcome.end_s >= outcome.duration_s > 0


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    def times(s: Scenario) -> list[tuple[float | None, float | None]]:
        return [(r.ttft_s, r.e2e_s) for r in simulate(s).records]

    first = times(scenario())
    assert times(scenario()) == first
    assert times(scenario(seed=7)) != first


def test_a_region_outage_mid_run_is_failed_over_to_the_other_region() -> None:
    outage = [{"at_s": 5, "kind": "crash", "region": "east"},
              {"at_s": 12, "kind": "recover", "region": "east"}]  # fmt: skip
    outcome, steady = simulate(scenario(events=outage)), simulate(scenario())
    # Streams cut by the crash are continued in the west, requests sent meanwhile go there:
    # every client has its answer, those cut later than they would have.
    assert all(r.ok for r in outcome.records), {r.error for r in outcome.records}
    cut = [(r.e2e_s or 0.0, s.e2e_s or 0.0) for r, s in zip(outcome.records, steady.records,
           strict=True) if r.sent_s < 5 < r.sent_s + (s.e2e_s or 0.0)]  # fmt: skip
    assert len(cut) >= 3
    assert all(late > usual for late, usual in cut)


def test_clients_far_from_the_gateway_wait_for_the_network() -> None:
    here = simulate(scenario())
    far = simulate(scenario(workload={"name": "azure-conv", "max_requests": 300, "speed": 4.0,
                                      "clients": {"west": 1.0}}))  # fmt: skip
    # The only gateway is in the east: 30 ms each way before the first token.
    gaps = [f.ttft_s - h.ttft_s for f, h in zip(far.records, here.records, strict=True)]  # type: ignore[operator]
    assert min(gaps) > 0.05


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"regions": []}, "at least one region"),
        ({"workload": {"name": "azure-conv", "clients": {"mars": 1.0}}}, "unknown region 'mars'"),
        ({"regions": [{"name": "x", "pools": [{"model": "m", "profile": "tpu"}]}]},
         "unknown engine profile 'tpu'"),
        ({"events": [{"at_s": -1, "kind": "crash", "region": "east"}]}, "at_s"),
        ({"regions": [{"name": "x", "gateways": 0}]}, "at least one gateway"),
        ({"workload": {"name": "azure-conv", "speed": 0}}, "workload.speed"),
        ({"surprise": 1}, "unknown field `surprise`"),
        ({"default_latency_ms": -5}, "default_latency_ms must be >= 0"),
        ({"slo": {"ttft_ms": -1}}, "slo.ttft_ms must be a number of ms > 0"),
        ({"events": [{"at_s": 1, "kind": "crash", "region": "east", "zone": "z"}]},
         "zone 'z' is not one of region 'east'"),
        ({"regions": [{"name": "x", "pools": [{"model": "m", "replicas": 10**9}]}]},
         "at most 100,000 replicas"),
        ({"gateway": {"pools": [{"model": "m", "health_check": {"kind": "heartbeat"}}]}},
         "no heartbeats"),
        ({"workload": {"name": "synthetic", "rate": 1e6, "duration_s": 1e6}},
         "give max_requests"),
        ({"gateway": {"pools": [{"model": "m", "polcy": "x"}]}}, "unknown field `polcy`"),
    ],
)  # fmt: skip
def test_a_wrong_scenario_is_refused_saying_what_to_change(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        scenario(**change)


def test_the_command_reports_the_run_and_its_speed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    data = {"regions": [{"name": "r", "pools": [{"model": "m", "replicas": 2}]}],
            "workload": {"name": "mooncake-conv", "max_requests": 50},
            "gateway": {"pools": [{"model": "m"}]}}  # fmt: skip
    path.write_text(yaml.safe_dump(data))
    assert main(["simulate", "--scenario", str(path), "--out", str(tmp_path / "out")]) == 0
    said = capsys.readouterr().out
    assert "simulated 50 requests" in said and "simulated requests/s" in said
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["summary"]["completed"] == 50
    assert summary["config"]["simulated_requests_per_s"] > 0
    assert len((tmp_path / "out" / "requests.jsonl").read_text().splitlines()) == 50


def test_the_command_refuses_a_scenario_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--scenario", str(tmp_path / "none.yaml")]) == 2
    assert "cannot read scenario" in capsys.readouterr().err


def test_gateways_sharing_state_send_a_conversation_where_its_prefix_is() -> None:
    def fleet(gateways: int, shared: bool) -> Scenario:
        gateway: dict[str, Any] = {"pools": [{"model": "m"}]}
        if shared:  # the load board synced every 50 ms, not 10: the test's time
            gateway["state"] = {"url": "redis://simulated:6379/0", "load_sync_s": 0.05}
        return parse_scenario({
            "regions": [{"name": "r", "gateways": gateways,
                         "pools": [{"model": "m", "profile": "h100-llama3-8b", "replicas": 8}]}],
            "workload": {"name": "mooncake-conv", "max_requests": 1200, "speed": 4.0},
            "gateway": gateway,
        })  # fmt: skip

    # Clients reach the two gateways in turn, so a conversation's turns come through both:
    # apart, each gateway's prefix index knows half the turns; shared, both know all (the
    # hit rate of one gateway alone, less what the sync's lag costs).
    one = simulate(fleet(1, False)).prefix_hit_rate
    apart = simulate(fleet(2, False)).prefix_hit_rate
    shared = simulate(fleet(2, True))
    assert all(r.ok for r in shared.records)
    assert apart < one - 0.02 and shared.prefix_hit_rate > apart + 0.6 * (one - apart), (
        one,
        apart,
        shared.prefix_hit_rate,
    )


def e2e_between(outcome: Outcome, start: float, end: float) -> float:
    """Mean E2E of the requests sent in [start, end)."""
    times = [r.e2e_s or 0.0 for r in outcome.records if start <= r.sent_s < end]
    return sum(times) / len(times)


def test_a_slowdown_slows_the_answers_until_it_is_lifted() -> None:
    slow = [{"at_s": 5, "kind": "slowdown", "region": "east", "factor": 3.0},
            {"at_s": 12, "kind": "slowdown", "region": "east", "factor": 1.0}]  # fmt: skip
    outcome, steady = simulate(scenario(events=slow)), simulate(scenario())
    assert e2e_between(outcome, 6, 11) > 1.5 * e2e_between(steady, 6, 11)
    assert e2e_between(outcome, 16, 21) == pytest.approx(e2e_between(steady, 16, 21), rel=0.2)


def test_replicas_added_join_every_gateway_and_those_removed_leave_without_a_cut() -> None:
    fleet = {"regions": [{"name": "r", "gateways": 2, "zones": ["a", "b"],
                          "pools": [{"model": "m", "replicas": 1, "gpus": 2}]}],
             "workload": {"name": "azure-conv", "max_requests": 400, "speed": 4.0},
             "gateway": {"pools": [{"model": "m"}]}}  # fmt: skip
    grow = [{"at_s": 2, "kind": "add", "region": "r", "replicas": 3},
            {"at_s": 15, "kind": "remove", "region": "r", "replicas": 2}]  # fmt: skip
    grown = simulate(parse_scenario({**fleet, "events": grow}))
    alone = simulate(parse_scenario(fleet))
    assert all(r.ok for r in grown.records)
    assert [(t, up, gpus) for t, _, up, gpus in grown.capacity] == [
        (0.0, 1, 2), (2.0, 4, 8), (15.0, 2, 4)
    ]  # fmt: skip
    # One replica alone falls behind; with three more the queue is gone.
    assert e2e_between(grown, 8, 15) < 0.5 * e2e_between(alone, 8, 15)


def test_a_surge_sends_the_workload_faster_for_its_duration() -> None:
    surge = [{"at_s": 5, "kind": "surge", "factor": 3.0, "duration_s": 4}]
    outcome, steady = simulate(scenario(events=surge)), simulate(scenario())

    def sent(o: Outcome, start: float, end: float) -> int:
        return sum(1 for r in o.records if start <= r.sent_s < end)

    assert sent(outcome, 5, 9) == sent(steady, 5, 17)  # 12 s of workload in 4
    assert sent(outcome, 0, 5) == sent(steady, 0, 5)


def autoscaled(events: list[dict[str, Any]], gateways: int = 1, shared: bool = False) -> Scenario:
    """One replica to start with, under more load than it can carry, autoscaled."""
    scale = {"enabled": True, "min_replicas": 1, "max_replicas": 6, "interval_s": 5,
             "target_in_flight": 16}  # fmt: skip
    gateway: dict[str, Any] = {"pools": [{"model": "m", "autoscale": scale}]}
    if shared:
        gateway["state"] = {"url": "redis://simulated:6379/0", "load_sync_s": 0.05}
    return parse_scenario({
        "regions": [{"name": "r", "gateways": gateways,
                     "pools": [{"model": "m", "replicas": 1, "startup_s": 10}]}],
        "workload": {"name": "azure-conv", "max_requests": 1500, "speed": 4.0},
        "gateway": gateway, "events": events,
    })  # fmt: skip


def test_the_gateways_autoscaler_adds_replicas_that_serve_after_their_start_up() -> None:
    grown = simulate(autoscaled([]))
    ups = [(t, up) for t, _, up, _ in grown.capacity]
    assert ups[0] == (0.0, 1) and ups[-1][1] >= 3
    assert ups[1][0] >= 5 + 10  # a tick, then the start-up
    # Stopped from the start: it recommends, nothing acts.
    held = simulate(autoscaled([{"at_s": 0, "kind": "autoscale", "enabled": False}]))
    assert [up for _, _, up, _ in held.capacity] == [1]
    assert e2e_between(grown, 40, 60) < 0.5 * e2e_between(held, 40, 60)


def test_two_gateways_sharing_state_scale_the_pool_once() -> None:
    one = simulate(autoscaled([]))
    two = simulate(autoscaled([], gateways=2, shared=True))  # the lease holder acts
    assert all(r.ok for r in two.records)
    assert abs(two.capacity[-1][2] - one.capacity[-1][2]) <= 1
    with pytest.raises(ConfigError, match="give the gateway config a `state"):
        autoscaled([], gateways=2)


def test_progress_is_told_as_simulated_time_passes() -> None:
    told: list[tuple[float, int, int]] = []
    outcome = simulate(scenario(), progress=lambda *at: told.append(at))
    times = [t for t, _, _ in told]
    assert len(told) > 10 and times == sorted(times)
    assert told[-1][1:] == (300, 300) and told[-1][0] == pytest.approx(outcome.end_s, abs=1.0)


def test_the_command_says_gpu_hours_and_when_an_outage_was_failed_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    data = {"regions": [{"name": "east", "pools": [{"model": "m", "replicas": 2, "gpus": 2}]},
                        {"name": "west", "gateways": 0, "pools": [{"model": "m"}]}],
            "workload": {"name": "azure-conv", "max_requests": 100, "speed": 4.0,
                         "clients": {"east": 1.0}},
            "gateway": {"pools": [{"model": "m"}]},
            "events": [{"at_s": 3, "kind": "crash", "region": "east"},
                       {"at_s": 6, "kind": "recover", "region": "east"}]}  # fmt: skip
    path.write_text(yaml.safe_dump(data))
    assert main(["simulate", "--scenario", str(path)]) == 0
    said = capsys.readouterr().out
    assert "GPU-hours:" in said
    assert "east crash at 3 s: its clients served again after" in said


def test_a_gateway_that_cannot_be_built_is_refused_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    data = {"regions": [{"name": "r", "pools": [{"model": "m"}]}],
            "workload": {"name": "azure-conv", "max_requests": 10},
            "gateway": {"pools": [{"model": "m", "policy": "fastest_please"}]}}  # fmt: skip
    path.write_text(yaml.safe_dump(data))
    assert main(["simulate", "--scenario", str(path)]) == 2
    assert "fastest_please" in capsys.readouterr().err


def test_a_simulated_gateway_counts_for_metrics_only_when_its_config_asks() -> None:
    assert not gateway_config(scenario(), "east").server.metrics
    asked = scenario(gateway={"pools": [{"model": "m"}], "server": {"metrics": True}})
    config = gateway_config(asked, "west")
    assert config.server.metrics and not config.server.dashboard
    assert config.server.region == "west"


def test_a_replica_in_another_region_answers_a_round_trip_later() -> None:
    def fleet(replicas_in: str) -> Scenario:
        return parse_scenario({
            "regions": [{"name": "east", "pools": [{"model": "m", "replicas": 2}]
                         if replicas_in == "east" else []},
                        {"name": "west", "gateways": 0, "pools": [{"model": "m", "replicas": 2}]
                         if replicas_in == "west" else []}],
            "latency_ms": {"east": {"west": 30}},
            "workload": {"name": "azure-conv", "max_requests": 50, "speed": 0.5},
            "gateway": {"pools": [{"model": "m"}]},
        })  # fmt: skip

    near, far = simulate(fleet("east")), simulate(fleet("west"))
    gaps = [(f.ttft_s or 0.0) - (n.ttft_s or 0.0) for f, n in zip(far.records, near.records,
                                                                   strict=True)]  # fmt: skip
    assert min(gaps) == pytest.approx(0.060, abs=0.005)  # the request there, the head back


def test_a_region_may_mix_engines_of_one_model() -> None:
    mixed = parse_scenario({
        "regions": [{"name": "r", "pools": [
            {"model": "m", "profile": "h100-llama3-8b", "replicas": 2},
            {"model": "m", "profile": "a100-llama3-8b", "replicas": 2}]}],
        "workload": {"name": "azure-conv", "max_requests": 100, "speed": 2.0},
        "gateway": {"pools": [{"model": "m"}]},
    })  # fmt: skip
    fleet = list(replicas(mixed))
    assert len({r.url for r in fleet}) == 4
    assert [r.pool.profile for r in fleet] == ["h100-llama3-8b"] * 2 + ["a100-llama3-8b"] * 2
    outcome = simulate(mixed)
    assert all(r.ok for r in outcome.records) and outcome.capacity[0][2] == 4


def test_replicas_asked_for_are_not_asked_for_again_while_they_start() -> None:
    # Two regions' gateways share the lease; start-up is longer than a tick: while the
    # replicas asked for come up, no gateway asks for them again, and they come up where the
    # lease holder is.
    scale = {"enabled": True, "min_replicas": 2, "max_replicas": 12, "interval_s": 5,
             "target_in_flight": 16}  # fmt: skip
    fleet = parse_scenario({
        "regions": [{"name": r, "pools": [{"model": "m", "replicas": 1, "startup_s": 20}]}
                    for r in ("a", "b")],
        "workload": {"name": "azure-conv", "max_requests": 4000, "speed": 8.0,
                     "clients": {"a": 1.0, "b": 1.0}},
        "gateway": {"pools": [{"model": "m", "autoscale": scale}],
                    "state": {"url": "redis://simulated:6379/0", "load_sync_s": 0.05}},
    })  # fmt: skip
    grown = simulate(fleet)
    added = [(t, region, up) for t, region, up, _ in grown.capacity if t > 0]
    assert added and len({region for _, region, _ in added}) == 1  # the lease holder's
    first = added[0][0]
    assert all(t >= first for t, _, _ in added) and first >= 20
    assert added[-1][2] <= 12 - 1  # the other region keeps its one


def test_a_stream_that_cannot_be_continued_is_counted_failed_not_answered() -> None:
    # Every replica dies for good at 5 s: the streams under way break and there is nowhere to
    # continue them; their clients get an error event, which counts as the bench counts it.
    gone = simulate(scenario(events=[{"at_s": 5, "kind": "crash", "region": "east"},
                                     {"at_s": 5, "kind": "crash", "region": "west"}]))  # fmt: skip
    errors = {r.error for r in gone.records if r.sent_s < 5}
    assert "stream_error" in errors
    assert not any(r.ok for r in gone.records if r.sent_s > 6)


def test_inference_health_probes_reach_the_engines() -> None:
    probed = simulate(scenario(gateway={"pools": [{"model": "m", "health_check": {
        "kind": "inference", "interval_s": 1}}]}))  # fmt: skip
    assert all(r.ok for r in probed.records)


def test_a_prompt_larger_than_a_replicas_cache_is_refused_with_a_400() -> None:
    # Mooncake's prompts, 40 times longer: most are over the 430k tokens an H100 holds.
    huge = simulate(scenario(workload={"name": "mooncake-conv", "max_requests": 10,
                                       "length_scale": 40.0}))  # fmt: skip
    assert "http_400" in {r.error for r in huge.records}


def test_removing_more_replicas_than_are_there_removes_them_all() -> None:
    outcome = simulate(scenario(events=[
        {"at_s": 0, "kind": "add", "region": "west", "replicas": 1},
        {"at_s": 1, "kind": "remove", "region": "west", "replicas": 9}]))  # fmt: skip
    west = [up for _, region, up, _ in outcome.capacity if region == "west"]
    assert west == [2, 3, 0]


def test_a_surge_does_not_end_the_sending_early() -> None:
    surge = [{"at_s": 5, "kind": "surge", "factor": 3.0, "duration_s": 4}]
    bounded = {"name": "azure-conv", "speed": 4.0, "duration_s": 20}
    outcome = simulate(scenario(workload=bounded, events=surge))
    assert 19 < max(r.sent_s for r in outcome.records) < 20


def test_the_workloads_tenants_are_the_gateways_callers_with_their_limits() -> None:
    tenants = [
        {"name": "gold", "keys": ["sk-gold-0123456789"], "priority": "critical"},
        {"name": "free", "keys": ["sk-free-0123456789"], "limits": {"requests_per_minute": 60}},
    ]
    workload = {"name": "azure-conv", "max_requests": 300, "speed": 4.0,
                "tenants": {"gold": 1.0, "free": 1.0}}  # fmt: skip
    shared = scenario(workload=workload,
                      gateway={"pools": [{"model": "m"}], "tenants": tenants})  # fmt: skip
    outcome = simulate(shared)
    who = {r.index: tenant for r, tenant in zip(outcome.records, outcome.tenants, strict=True)}
    assert set(who.values()) == {0, 1}
    refused = [r for r in outcome.records if r.error == "http_429"]
    assert refused and all(who[r.index] == 1 for r in refused)  # free's limit, not gold's
    assert all(r.ok for r in outcome.records if who[r.index] == 0)
    with pytest.raises(ConfigError, match="is no tenant with a key"):
        scenario(workload={**workload, "tenants": {"bronze": 1.0}},
                 gateway={"pools": [{"model": "m"}], "tenants": tenants})  # fmt: skip
    with pytest.raises(ConfigError, match="say who sends the workload"):
        scenario(gateway={"pools": [{"model": "m"}], "tenants": tenants})


def test_gpu_hours_count_replicas_while_they_start() -> None:
    grown = simulate(autoscaled([]))
    assert grown.booting and all(
        until - at == pytest.approx(10) for at, until, _, _ in grown.booting
    )
    without = dataclasses.replace(grown, booting=[])
    starting = sum(g * (min(until, grown.end_s) - at) for at, until, _, g in grown.booting)
    assert gpu_hours(autoscaled([]), grown) == pytest.approx(
        gpu_hours(autoscaled([]), without) + starting / 3600
    )
