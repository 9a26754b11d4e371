"""`fleetgate simulate`: run a scenario (simulate/scenario.py) and report it as `fleetgate
bench` reports a run: the summary table (all clients, then each client region's), the rate
the simulation ran at, and with --out the same files (summary.json, requests.jsonl) and the
report over time (simulate/page.py: timeline.json, plots, index.html).

Per-token inter-token latencies are not simulated (a stream is its first token and its end):
the report gives each request's mean time per output token (TPOT), which the goodput SLO
judges, and no ITL distribution."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import rich.progress
from rich.console import Console

from fleetgate.bench.report import summary_table, write_results
from fleetgate.bench.stats import RequestRecord, Summary, summarize
from fleetgate.config import ConfigError
from fleetgate.simulate import capacity, compare
from fleetgate.simulate.page import write_report
from fleetgate.simulate.report import failover_times, gpu_hours
from fleetgate.simulate.run import Outcome, Progress, simulate
from fleetgate.simulate.scenario import Scenario, load_scenario


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", required=True, type=Path, help="the scenario YAML file")
    parser.add_argument(
        "--out",
        type=Path,
        help="write summary.json, requests.jsonl, timeline.json, the plots and index.html here",
    )
    parser.add_argument("--seed", type=int, help="the run's seed (default: the scenario's)")
    compare.add_arguments(parser)
    capacity.add_arguments(parser)


def process_age_s() -> float:
    """Seconds since this process started (to the kernel's 10 ms tick; 0 where /proc has no
    answer): the simulator's rate counts its start-up."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


def report(scenario: Scenario, outcome: Outcome) -> dict[str, Summary]:
    """The summary over every client, then per client region (where there are several), then
    per tenant of the workload's.
    Rates are per second from the start to the last answer, as `fleetgate bench` counts them
    (its run's duration ends with its last request's end)."""
    slo = scenario.slo.slo()

    def summary(records: list[RequestRecord]) -> Summary:
        return dataclasses.replace(summarize(records, outcome.end_s, slo), itl_ms=None)

    summaries = {"all clients": summary(outcome.records)}
    regions = [r.name for r in scenario.regions]
    if len({*outcome.clients}) > 1:
        for i, region in enumerate(regions):
            mine = [r for r, c in zip(outcome.records, outcome.clients, strict=True) if c == i]
            if mine:
                summaries[f"clients in {region}"] = summary(mine)
    for i, tenant in enumerate(scenario.workload.tenants):
        theirs = [r for r, t in zip(outcome.records, outcome.tenants, strict=True) if t == i]
        if theirs:
            summaries[f"tenant {tenant}"] = summary(theirs)
    return summaries


@contextlib.contextmanager
def _progress(console: Console, duration_s: float) -> Iterator[Progress]:
    """A progress bar on `console` (a terminal's only): simulated time, requests, speed."""
    bar = rich.progress.Progress(
        rich.progress.TextColumn("simulated {task.completed:,.0f} of {task.total:,.0f} s"),
        rich.progress.BarColumn(),
        rich.progress.TextColumn("{task.fields[said]}"),
        console=console, transient=True, disable=not console.is_terminal,
    )  # fmt: skip
    began = time.perf_counter()
    with bar:
        task = bar.add_task("simulate", total=duration_s, said="")

        def tell(now: float, sent: int, answered: int) -> None:
            rate = answered / max(1e-9, time.perf_counter() - began)
            said = f"{sent:,} sent, {answered:,} answered, {rate:,.0f} requests/s"
            bar.update(task, completed=min(now, duration_s), said=said)

        yield tell


def main(args: argparse.Namespace) -> int:
    console, errors = Console(), Console(stderr=True)
    try:
        scenario = load_scenario(args.scenario)
        if args.seed is not None:
            scenario = msgspec.structs.replace(scenario, seed=args.seed)
    except ConfigError as exc:
        errors.print(f"[red]error:[/] {exc}")
        return 2
    if args.compare is not None and args.find_replicas is not None:
        errors.print("[red]error:[/] --compare and --find-replicas are two studies: give one")
        return 2
    if args.compare is not None:
        return compare.compare(scenario, args.compare, args.out, report)
    if args.find_replicas is not None:
        return capacity.find_replicas(
            scenario, args.find_replicas, target=args.target, slo_ttft_ms=args.slo_ttft_ms,
            slo_itl_ms=args.slo_itl_ms, out=args.out, report=report,
        )  # fmt: skip
    started = time.perf_counter() - process_age_s()
    try:
        with _progress(errors, scenario.workload.duration_s) as tell:
            outcome = simulate(scenario, started, tell)
    except ConfigError as exc:  # what only building the gateway finds (a pipeline's params)
        errors.print(f"[red]error:[/] {exc}")
        return 2
    summaries = report(scenario, outcome)
    for title, summary in summaries.items():
        console.print(summary_table(summary, f"{scenario.name}: {title}"))
    console.print(f"GPU-hours: {gpu_hours(scenario, outcome):,.1f}")
    for failover in failover_times(scenario, outcome):
        event, took = failover.event, failover.served_again_s
        said = "not served again" if took is None else f"served again after {took:,.1f} s"
        console.print(f"{event.region} {event.kind} at {event.at_s:g} s: its clients {said}")
    count = len(outcome.records)
    console.print(
        f"simulated {count:,} requests over {outcome.end_s:,.0f} s in {outcome.wall_s:.2f} s of "
        f"wall time (the process's start-up included): {count / outcome.wall_s:,.0f} simulated "
        "requests/s"
    )
    if args.out is not None:
        config = {"scenario": msgspec.to_builtins(scenario), "wall_s": outcome.wall_s,
                  "simulated_requests_per_s": count / outcome.wall_s}  # fmt: skip
        written = write_results(args.out, summaries["all clients"], config, outcome.records)
        for path in [*written, *write_report(args.out, scenario, outcome, summaries)]:
            console.print(f"wrote {path}")
    return 0
