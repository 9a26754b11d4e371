"""The routing benchmark's runs in the fleet simulator (`benchmarks/routing.py --sim`): a
workload's fleet grown to any size, its offered load grown with it, and one policy's run
through `fleetgate.simulate` (the gateway's own code over fleet-level engine models in virtual
time), kept as routing.py keeps a live run.

Offered load: routing.py's rates are for its live fleet of sim workers slowed LIVE_SLOWDOWN
times (so that 2 cores keep up with them); the simulator runs each profile at its modelled
speed, so one replica here is offered LIVE_SLOWDOWN times a live replica's rate, the same
share of its capacity:

    offered req/s = live rate x LIVE_SLOWDOWN x replicas / live replicas

A trace workload grows by `users` (copies of the trace, each with its own prompts, shifted in
time) and `speed` for what a whole number of copies leaves; a generated one by its `rate`.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from fleetgate.bench.report import summary_json, write_results
from fleetgate.bench.stats import Slo, summarize
from fleetgate.simulate.run import simulate
from fleetgate.simulate.scenario import Scenario, parse_scenario
from fleetgate.simulate.workload import MAX_DURATION_S, MAX_USERS, WorkloadSettings, requests

LIVE_SLOWDOWN = 4.0  # routing.py's default --slowdown: the dilation its workloads' rates assume
TRACES = ("azure-conv", "mooncake-conv")  # grown by users; the others by rate
REGION = "local"
SIMULATED_OPTIONS = {"--workload", "--rate"}  # the bench options a scenario's workload takes


def refusal(fleet: Sequence[tuple[str, int]], bench: str) -> str | None:
    """Why the simulator cannot run this workload as routing.py runs it live, or None."""
    extra = sorted(set(re.findall(r"--[\w-]+", bench)) - SIMULATED_OPTIONS)
    if extra:
        return f"the simulator's workload takes no {', '.join(extra)}"
    return None


def gpus_per_replica(profile: str) -> int:
    """GPUs one replica of `profile` runs on, as its name says (`<gpu>[xN]-<model>[-tpN]`)."""
    match = re.search(r"^[a-z0-9]+x(\d+)-|-tp(\d+)$", profile)
    return int(match[1] or match[2]) if match else 1


def replicas_for(
    fleet: Sequence[tuple[str, int]], *, replicas: int | None, gpus: int | None
) -> int:
    """The simulated fleet's size: `replicas`, else `gpus` in replicas of the fleet's mix of
    profiles, else the live fleet's (ValueError: GPUs that are not a whole number of
    replicas)."""
    live = sum(count for _, count in fleet)
    if replicas is not None:
        return replicas
    if gpus is None:
        return live
    per = sum(count * gpus_per_replica(profile) for profile, count in fleet) / live
    if gpus % per:
        raise ValueError(f"--gpus {gpus} is not a whole number of replicas ({per:g} GPUs each)")
    return round(gpus / per)


@functools.cache  # a trace read once, not once a policy
def trace_rate(name: str) -> float:
    """A shipped trace's mean req/s over its span, as the simulator replays it."""
    settings = msgspec.convert({"name": name, "duration_s": MAX_DURATION_S}, WorkloadSettings)
    times = [r.at_s for r in requests(settings, [REGION], random.Random(0))]
    return len(times) / times[-1]


def scenario(
    *, fleet: Sequence[tuple[str, int]], bench: str, model: str, policy: str, replicas: int,
    duration_s: float, slo: Slo,
) -> Scenario:  # fmt: skip
    """One region, one gateway routing `model` by `policy` over `replicas` in the fleet's mix
    of profiles, offered the live per-replica load (module docstring) for `duration_s` of
    sending."""
    live = sum(count for _, count in fleet)
    name = re.search(r"--workload (\S+)", bench)
    rate = re.search(r"--rate (\S+)", bench)
    assert name is not None and rate is not None, bench
    offered = float(rate[1]) * LIVE_SLOWDOWN * replicas / live
    workload: dict[str, Any] = {"name": name[1], "duration_s": duration_s}
    if name[1] in TRACES:
        copy = trace_rate(name[1])
        users = min(MAX_USERS, max(1, round(offered / copy)))
        workload |= {"users": users, "speed": offered / (users * copy)}
    else:
        workload["rate"] = offered
    pools = [
        {"model": model, "profile": profile, "replicas": max(1, round(replicas * count / live)),
         "gpus": gpus_per_replica(profile)}
        for profile, count in fleet
    ]  # fmt: skip
    return parse_scenario({
        "name": f"routing-{name[1]}-{policy}", "seed": 0,
        "regions": [{"name": REGION, "gateways": 1, "pools": pools}],
        "workload": workload,
        "gateway": {"pools": [{"model": model, "policy": policy}], "seed": 1},
        "slo": {"ttft_ms": slo.ttft_ms, "itl_ms": slo.itl_ms},
    })  # fmt: skip


def run(scenario: Scenario, tight: Slo, out: Path) -> dict[str, Any]:
    """Simulate `scenario`, write the bench's files (summary.json, requests.jsonl) to `out`,
    and return what routing.py keeps of a live run. Throughput is over the time until the last
    answer and goodput over the sending window, as live; the utilization and KV spreads are
    not simulated (None)."""
    outcome = simulate(scenario)
    records = outcome.records
    # A simulated stream is its first token and its end (simulate/command.py): no ITL figures.
    summary = dataclasses.replace(
        summarize(records, outcome.end_s, scenario.slo.slo()), itl_ms=None
    )
    config = {"scenario": msgspec.to_builtins(scenario), "wall_s": outcome.wall_s}
    write_results(out, summary, config, records)
    good = (summary.slo_attainment or 0.0) * summary.requests
    within_tight = summarize(records, outcome.duration_s, tight).slo_attainment
    return {
        "summary": summary_json(summary, config)["summary"],
        "goodput": good / outcome.duration_s,
        "slo_attainment_tight": within_tight or 0.0,
        "hit_rate": outcome.prefix_hit_rate,
        "spread": None,
        "kv_spread": None,
    } | config
