"""`fleetgate simulate --compare CONFIG [CONFIG ...]`: one scenario under several gateway
configs, run side by side (one process each, simulate/parallel.py) and printed as `fleetgate
bench --compare` prints saved runs, every number with its ratio to the first config's.

A CONFIG is a YAML file of a gateway config, what the scenario's `gateway:` holds (its pools'
backends are the scenario's replicas, whatever the file says), or `policy:NAME`: the scenario's
own config with every pool routed by that policy or profile. Every config sees the same
requests at the same times: the workload's seed does not depend on the gateway.
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml
from rich.console import Console
from rich.table import Table

from fleetgate.bench.compare import SavedRun, compare_table
from fleetgate.bench.report import write_results
from fleetgate.bench.stats import Summary
from fleetgate.config import ConfigError
from fleetgate.routing.registry import UnknownPlugin, default_registry
from fleetgate.simulate.parallel import Report, simulate_all
from fleetgate.simulate.report import gpu_hours
from fleetgate.simulate.run import Outcome
from fleetgate.simulate.scenario import Scenario, parse_scenario

POLICY = "policy:"  # a CONFIG that names a policy rather than a file
COMPARISON_FILE = "comparison.txt"  # --out: the tables as printed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="CONFIG",
        help="run the scenario under each gateway config (a YAML file, or policy:NAME for the "
        "scenario's with every pool's policy set to NAME) and print them side by side; --out "
        "gets a folder per config and comparison.txt",
    )


@dataclass(frozen=True, slots=True)
class Contender:
    """One config of the comparison."""

    name: str  # as given on the command line
    folder: str  # its sub-folder of --out
    scenario: Scenario  # the scenario with this gateway config


def with_policy(gateway: dict[str, Any], policy: str) -> dict[str, Any]:
    """`gateway` with every pool routed by `policy`; a pool's own `routing` and
    `policy_params` are dropped, as they were another policy's (ConfigError: no such policy)."""
    known = default_registry().policy_names
    if policy not in known:
        raise ConfigError(f"unknown routing policy {policy!r}; known: {', '.join(known)}")
    pools = [
        {**{k: v for k, v in pool.items() if k not in ("routing", "policy_params")},
         "policy": policy}
        for pool in gateway.get("pools", [])
    ]  # fmt: skip
    return {**gateway, "pools": pools}


def read_gateway(path: Path) -> dict[str, Any]:
    """A gateway config file as data (checked with the scenario, by the caller)."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path} is not a YAML file: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a gateway config is a mapping (pools: ...)")
    return data


def contenders(scenario: Scenario, configs: Sequence[str]) -> list[Contender]:
    """The scenario under each config, each checked as a scenario's `gateway:` is
    (ConfigError naming the config that is wrong)."""
    found: list[Contender] = []
    folders: set[str] = set()
    for given in configs:
        if given.startswith(POLICY):
            gateway = with_policy(scenario.gateway, given.removeprefix(POLICY))
            folder = given.replace(":", "-")
        else:
            gateway, folder = read_gateway(Path(given)), Path(given).stem
        try:
            rebuilt = parse_scenario({**msgspec.to_builtins(scenario), "gateway": gateway})
        except ConfigError as exc:
            raise ConfigError(f"{given}: {exc}") from None
        unique, n = folder, 1
        while unique in folders:  # two files of one name in different folders
            n += 1
            unique = f"{folder}-{n}"
        folders.add(unique)
        found.append(Contender(given, unique, rebuilt))
    return found


@dataclass(frozen=True, slots=True)
class Result:
    """One config's run."""

    run: Contender
    outcome: Outcome
    summaries: dict[str, Summary]  # by title, as command.report gives them
    config: dict[str, Any]  # summary.json's `config`


def compare(scenario: Scenario, configs: Sequence[str], out: Path | None, report: Report) -> int:
    """Run and print the comparison; 0, or 2 when a config is wrong."""
    console, errors = Console(), Console(stderr=True)
    try:
        runs = contenders(scenario, configs)
        started = time.perf_counter()
        outcomes = simulate_all([run.scenario for run in runs])
    except (ConfigError, UnknownPlugin) as exc:  # UnknownPlugin: a file's policy, at compose
        errors.print(f"[red]error:[/] {exc}")
        return 2
    wall = time.perf_counter() - started
    results = [
        Result(run, outcome, report(run.scenario, outcome), saved_config(run, outcome))
        for run, outcome in zip(runs, outcomes, strict=True)
    ]
    tables = comparison_tables(scenario, results)
    for table in tables:
        console.print(table)
    for r in results:  # what the bench's table has no row for: the fleet's cost
        hours = gpu_hours(r.run.scenario, r.outcome)
        console.print(f"{r.run.name}: {hours:,.1f} GPU-hours")
    count = len(outcomes[0].records)
    console.print(f"simulated {len(runs)} configs of {count:,} requests each in {wall:.2f} s of "
                  "wall time, in parallel processes")  # fmt: skip
    if out is not None:
        for path in write_comparison(out, results, tables):
            console.print(f"wrote {path}")
    return 0


def comparison_tables(scenario: Scenario, results: Sequence[Result]) -> list[Table]:
    """`fleetgate bench --compare`'s table for each summary every run has (all clients, then
    each client region's)."""
    titles = [t for t in results[0].summaries if all(t in r.summaries for r in results)]
    return [
        compare_table(
            [SavedRun(r.run.name, r.config, r.summaries[title]) for r in results],
            f"{scenario.name}: {title}",
        )
        for title in titles
    ]


def saved_config(run: Contender, outcome: Outcome) -> dict[str, Any]:
    """What summary.json's `config` holds for one config's run: what a single run's holds,
    and what `fleetgate bench --compare` shows of a run (its workload and target)."""
    return {
        "scenario": msgspec.to_builtins(run.scenario),
        "compared_as": run.name,
        "workload": run.scenario.workload.name,
        "target": f"{run.scenario.name} under {run.name}",
        "wall_s": outcome.wall_s,
        "simulated_requests_per_s": len(outcome.records) / outcome.wall_s,
    }


def write_comparison(out: Path, results: Sequence[Result], tables: Sequence[Table]) -> list[Path]:
    """One sub-folder per config with the bench's files, summary.json and requests.jsonl (so
    `fleetgate bench --compare` reads them too; the report over time is a single run's), and
    the tables as text."""
    written: list[Path] = []
    for r in results:
        folder = out / r.run.folder
        written += write_results(folder, r.summaries["all clients"], r.config, r.outcome.records)
    text = io.StringIO()
    plain = Console(file=text, width=200, color_system=None)
    for table in tables:
        plain.print(table)
    path = out / COMPARISON_FILE
    path.write_text(text.getvalue())
    return [*written, path]
