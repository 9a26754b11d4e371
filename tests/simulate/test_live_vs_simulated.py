"""The simulator against a live run of the same fleet: real `fleetgate worker sim` processes
behind a real `fleetgate serve`, loaded by `fleetgate bench`, and `simulate` of the same
replicas, gateway config (the default routing) and workload; throughput and TTFT and E2E p50
and p90 agree within 10%.

The fleet is 3 H100 sim replicas stepping 4 times slower than the GPU (so that 2 cores keep
up), the workload Azure's conversations replayed at 3 times the trace's speed: the first 300
requests arrive at 10.7 req/s, their prompt and answer tokens 43% of the fleet's compute (1,156
tokens a request, 4 x 26 us each, over 3 replicas); TTFT p90 is about twice its p50. At 7
times the speed the compute is all used (TTFT p50 1.3 s); at 3.5 times the live TTFT p90, set
by a few prompts queued behind one another, already varies by 5% from run to run.

The live gateway's random choices (routing's tie-breaks, scrape jitter) are its own, so the
simulated figures are the mean over SEEDS, each seed one draw of them; their spread is printed.
docs/simulator.md (Validation) says what the live run adds that the simulation leaves out.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path
from typing import Any

from fleetgate.bench.command import add_arguments, config_from_args
from fleetgate.bench.config import build_workload
from fleetgate.bench.report import RECORDS_FILE, SUMMARY_FILE, read_records
from fleetgate.bench.stats import RequestRecord, Slo, Summary, summarize
from fleetgate.simulate.run import simulate
from fleetgate.simulate.scenario import Scenario, parse_scenario
from fleetgate.simulate.workload import requests
from tests.e2e.procs import fleetgate, gateway, metric, sim_workers

MODEL = "m"
PROFILE = "h100-llama3-8b"
REPLICAS = 3
SLOWDOWN = 4.0
SPEED = 3.0  # the trace's times divided by this
REQUESTS = 300
DURATION_S = 120.0  # a bound the requests' times never reach
SEED = 0  # the bench's (its prompts' filler text) and the first simulation's
SEEDS = range(SEED, SEED + 8)  # the simulations'
GATEWAY: dict[str, Any] = {"seed": 1, "pools": [{"model": MODEL}]}  # the serve config of both
TOLERANCE = 0.10
BENCH_TIMEOUT_S = 90.0
# What `fleetgate bench` is given, and the simulator's workload must equal.
BENCH_FLAGS = ["--workload", "azure-conv", "--trace-speed", str(SPEED),
               "--max-requests", str(REQUESTS), "--duration", str(DURATION_S),
               "--seed", str(SEED), "--model", MODEL]  # fmt: skip


def scenario(seed: int = SEED) -> Scenario:
    return parse_scenario({
        "seed": seed,
        "regions": [{"name": "local", "pools": [{"model": MODEL, "profile": PROFILE,
                                                 "replicas": REPLICAS, "slowdown": SLOWDOWN}]}],
        "workload": {"name": "azure-conv", "speed": SPEED, "max_requests": REQUESTS,
                     "duration_s": DURATION_S},
        "gateway": GATEWAY,
    })  # fmt: skip


def test_the_bench_and_the_simulator_send_the_same_requests() -> None:
    parser = argparse.ArgumentParser(prog="fleetgate bench")
    add_arguments(parser)
    config = config_from_args(parser.parse_args(["--target", "http://127.0.0.1:1", *BENCH_FLAGS]))
    sent = [(s.at_s, s.prompt_tokens, s.max_tokens)
            for s in build_workload(config, random.Random(config.seed))]  # fmt: skip
    workload = requests(scenario().workload, ["local"], random.Random(SEED))
    simulated = [(r.at_s, r.prompt_tokens, r.output_tokens) for r in workload]
    assert len(sent) == REQUESTS
    assert sent == simulated


def test_a_live_fleet_and_its_simulation_agree(tmp_path: Path) -> None:
    live, live_s, lost_s = _live(tmp_path)
    runs = [simulate(scenario(seed)) for seed in SEEDS]
    # Both replayed the same rows: the same times, lengths and answers.
    asked = [(r.scheduled_s, r.prompt_tokens, r.output_tokens) for r in live]
    for outcome in runs:
        assert [(r.scheduled_s, r.prompt_tokens, r.output_tokens) for r in outcome.records] == asked
    # Throughput over the run from its start to its last answer, as `fleetgate bench` counts.
    ours = summarize(live, live_s, Slo())
    theirs = [summarize(outcome.records, outcome.end_s, Slo()) for outcome in runs]
    assert ours.completed == REQUESTS and all(s.completed == REQUESTS for s in theirs)
    measured = _figures(ours)
    simulated = {name: [_figures(s)[name] for s in theirs] for name in measured}
    ratios = {name: statistics.fmean(simulated[name]) / measured[name] for name in measured}
    report = "\n".join(
        f"{name:>12}  live {measured[name]:8.1f}  simulated {statistics.fmean(v):8.1f} "
        f"(seeds {min(v):.1f} to {max(v):.1f})  simulated/live {ratios[name]:.3f}"
        for name, v in simulated.items()
    ) + f"\nthe sim workers fell {lost_s:.2f} s behind their modelled GPUs in all"  # fmt: skip
    print("\n" + report)
    wrong = [name for name, ratio in ratios.items() if abs(ratio - 1.0) > TOLERANCE]
    assert not wrong, f"{', '.join(wrong)} differ by more than {TOLERANCE:.0%}:\n{report}"


def _live(tmp_path: Path) -> tuple[list[RequestRecord], float, float]:
    """The live run's records by index, its duration (to the last answer) and the seconds
    its sim workers fell behind the GPUs they model (Python could not keep up)."""
    with sim_workers(MODEL, REPLICAS, PROFILE, SLOWDOWN) as urls:
        pools = [{**pool, "backends": [{"url": u, "engine": "vllm"} for u in urls]}
                 for pool in GATEWAY["pools"]]  # fmt: skip
        config = tmp_path / "gateway.json"
        config.write_text(json.dumps({**GATEWAY, "pools": pools}))
        out = tmp_path / "bench"
        with gateway(["--config", str(config)]) as (url, _):
            args = ["bench", "--target", url, *BENCH_FLAGS, "--quiet", "--out", str(out),
                    "--save-requests"]  # fmt: skip
            with fleetgate(args) as bench:
                code = bench.popen.wait(BENCH_TIMEOUT_S)
                assert code == 0, "\n".join(bench.lines)
        lost = sum(metric(u, "fleetgate_sim_lost_seconds_total") for u in urls)
    records = sorted(read_records(out / RECORDS_FILE), key=lambda r: r.index)
    duration = json.loads((out / SUMMARY_FILE).read_text())["summary"]["duration_s"]
    return records, duration, lost


def _figures(summary: Summary) -> dict[str, float]:
    """The compared figures of a run (latencies in ms)."""
    ttft, e2e = summary.ttft_ms, summary.e2e_ms
    assert ttft is not None and e2e is not None
    return {"requests/s": summary.request_throughput, "TTFT p50 ms": ttft.p50,
            "TTFT p90 ms": ttft.p90, "E2E p50 ms": e2e.p50, "E2E p90 ms": e2e.p90}  # fmt: skip
