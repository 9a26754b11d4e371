"""`fleetgate simulate --find-replicas POOL`: the fewest replicas of a pool for which at least
`target` of the scenario's requests meet the SLO (the bench's SLO attainment: requests meeting
it over requests sent).

A count is the pool's total over the regions that have it, split as the scenario splits it
(`split`): a pool only one region has grows there; one several have grows in all of them in
the scenario's proportions.

The search doubles from the scenario's own count until a count meets the target, then bisects
between the largest count known to miss (0 at first: no replicas serve nothing) and the
smallest known to meet. Each round probes as many counts as there are cores at once, one
simulation a process: W counts up the doubling ladder, or W counts splitting the gap into W+1
equal parts. It assumes attainment does not fall as replicas are added; that holds closely,
since every count replays the same requests at the same times (the workload's seed does not
depend on the fleet) and only the queueing changes, so a bump on the curve could only move the
answer by the width of that bump.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from fleetgate.bench.stats import Summary
from fleetgate.config import ConfigError
from fleetgate.simulate.parallel import Report, simulate_all
from fleetgate.simulate.scenario import Scenario, SloSpec

MAX_REPLICAS = 1024  # the doubling gives up here: the SLO is out of reach of replicas
CURVE_FILE = "replicas.json"  # --out
# Counts -> their SLO attainment, the counts run at once.
Measure = Callable[[Sequence[int]], Mapping[int, float]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--find-replicas",
        metavar="POOL",
        help="search the fewest replicas of the pool serving this model that meet the SLO "
        "for --target of the requests; --out gets the curve as replicas.json",
    )
    parser.add_argument(
        "--target",
        type=float,
        default=0.99,
        help="with --find-replicas: the share of requests sent that must meet the SLO, in "
        "(0, 1] (default: 0.99)",
    )
    parser.add_argument(
        "--slo-ttft-ms", type=float, help="with --find-replicas: the SLO's TTFT (default: the "
        "scenario's)"
    )  # fmt: skip
    parser.add_argument(
        "--slo-itl-ms", type=float, help="with --find-replicas: the SLO's time per output token "
        "(default: the scenario's)"
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Point:
    """One count the search ran."""

    replicas: int
    regions: dict[str, int]  # where they are: region -> replicas
    summary: Summary  # over every client

    @property
    def attainment(self) -> float:
        return self.summary.slo_attainment or 0.0


def split(current: Sequence[int], total: int) -> list[int]:
    """`total` shared in proportion to `current` (evenly when all are 0) by largest remainder:
    each gets the whole part of total * its share, and what is left goes one each to the
    largest fractional parts, the earlier first on a tie."""
    weights = list(current) if any(current) else [1] * len(current)
    whole = sum(weights)
    counts = [total * w // whole for w in weights]
    left = total - sum(counts)
    by_remainder = sorted(range(len(weights)), key=lambda i: -(total * weights[i] % whole))
    for i in by_remainder[:left]:
        counts[i] += 1
    return counts


def pool_sizes(scenario: Scenario, model: str) -> list[int]:
    """The pool's replicas in each of the scenario's pool entries serving `model`, in order
    (ConfigError: the scenario has no such pool)."""
    sizes = [p.replicas for r in scenario.regions for p in r.pools if p.model == model]
    served = [p.get("model") for p in scenario.gateway.get("pools", [])]
    if not sizes or model not in served:
        known = ", ".join(str(m) for m in served)
        raise ConfigError(f"no pool {model!r} in the scenario's regions and gateway; its: {known}")
    return sizes


def with_replicas(scenario: Scenario, model: str, total: int) -> Scenario:
    """The scenario with `total` replicas of the pool, split as `split` says."""
    counts = iter(split(pool_sizes(scenario, model), total))
    regions = []
    for region in scenario.regions:
        pools = []
        for pool in region.pools:
            if pool.model == model:
                pool = msgspec.structs.replace(pool, replicas=next(counts))
            pools.append(pool)
        regions.append(msgspec.structs.replace(region, pools=tuple(pools)))
    return msgspec.structs.replace(scenario, regions=tuple(regions))


def regions_of(scenario: Scenario, model: str) -> dict[str, int]:
    """Where the pool's replicas are: region -> replicas."""
    regions: dict[str, int] = {}
    for region in scenario.regions:
        for pool in region.pools:
            if pool.model == model:
                regions[region.name] = regions.get(region.name, 0) + pool.replicas
    return regions


def smallest_meeting(measure: Measure, *, target: float, start: int, width: int) -> int | None:
    """The smallest count whose attainment is at least `target`, probing `width` counts a
    round (None: not even MAX_REPLICAS meets it)."""
    miss = 0  # the largest count known to miss
    count = min(max(start, 1), MAX_REPLICAS)
    while True:  # doubling, until a count meets the target
        batch = sorted({min(count << i, MAX_REPLICAS) for i in range(width)})
        miss, meet = _first_meeting(measure(batch), target, miss)
        if meet is not None:
            break
        if batch[-1] >= MAX_REPLICAS:
            return None
        count = batch[-1] * 2
    while meet - miss > 1:  # bisection: `width` counts split (miss, meet) evenly
        gap = meet - miss
        batch = sorted({miss + gap * j // (width + 1) for j in range(1, width + 1)} - {miss})
        miss, better = _first_meeting(measure(batch), target, miss)
        meet = meet if better is None else better
    return meet


def _first_meeting(
    results: Mapping[int, float], target: float, miss: int
) -> tuple[int, int | None]:
    """The largest count known to miss below the first count that meets, and that count."""
    for count in sorted(results):
        if results[count] >= target:
            return miss, count
        miss = max(miss, count)
    return miss, None


def find_replicas(
    scenario: Scenario,
    pool: str,
    *,
    target: float,
    slo_ttft_ms: float | None,
    slo_itl_ms: float | None,
    out: Path | None,
    report: Report,
) -> int:
    """Search and print the count; 0, 1 when no count up to MAX_REPLICAS meets the target, 2
    on bad input."""
    console, errors = Console(), Console(stderr=True)
    try:
        scenario = searched(scenario, pool, target, (slo_ttft_ms, slo_itl_ms))
    except ConfigError as exc:
        errors.print(f"[red]error:[/] {exc}")
        return 2
    points: dict[int, Point] = {}

    def measure(counts: Sequence[int]) -> dict[int, float]:
        todo = [count for count in counts if count not in points]
        probes = [with_replicas(scenario, pool, count) for count in todo]
        for count, probe, outcome in zip(todo, probes, simulate_all(probes), strict=True):
            summary = report(probe, outcome)["all clients"]
            points[count] = Point(count, regions_of(probe, pool), summary)
        return {count: points[count].attainment for count in counts}

    start = sum(pool_sizes(scenario, pool))
    found = smallest_meeting(measure, target=target, start=start, width=os.cpu_count() or 1)
    curve = [points[count] for count in sorted(points)]
    console.print(curve_table(scenario, pool, curve, target))
    if found is None:
        best = max(curve, key=lambda p: p.attainment)
        console.print(f"{pool} does not reach attainment {target:g} with up to {MAX_REPLICAS} "
                      f"replicas (best {best.attainment:.4f} at {best.replicas})")  # fmt: skip
    else:
        below = f"{points[found - 1].attainment:.4f}" if found > 1 else "none"
        at = f"{points[found].attainment:.4f} at {found}, {below} at {found - 1}"
        console.print(f"{pool} needs {found} replicas (attainment {at})")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        path = out / CURVE_FILE
        doc = curve_json(scenario, pool, target, found, curve)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {path}")
    return 0 if found is not None else 1


def searched(
    scenario: Scenario, pool: str, target: float, flags: tuple[float | None, float | None]
) -> Scenario:
    """The scenario the search runs: its SLO's bounds each from the flags (TTFT, ITL ms) or
    else the scenario's (ConfigError: a bad target, pool or SLO)."""
    if not 0 < target <= 1:  # NaN too
        raise ConfigError(f"--target is a share of requests in (0, 1], got {target}")
    pool_sizes(scenario, pool)
    ttft = scenario.slo.ttft_ms if flags[0] is None else flags[0]
    itl = scenario.slo.itl_ms if flags[1] is None else flags[1]
    if ttft is None and itl is None:
        raise ConfigError("--find-replicas needs an SLO: give --slo-ttft-ms or --slo-itl-ms, "
                          "or `slo:` in the scenario")  # fmt: skip
    for flag, value in (("--slo-ttft-ms", ttft), ("--slo-itl-ms", itl)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{flag} must be a number of ms > 0, got {value}")
    return msgspec.structs.replace(scenario, slo=SloSpec(ttft_ms=ttft, itl_ms=itl))


def curve_table(scenario: Scenario, pool: str, curve: Sequence[Point], target: float) -> Table:
    """Each count run: its SLO attainment, goodput and TTFT p90."""
    slo = scenario.slo
    given = (("TTFT", slo.ttft_ms), ("TPOT", slo.itl_ms))
    bounds = [f"{label} <= {value:g} ms" for label, value in given if value is not None]
    table = Table(title=f"{scenario.name}: {pool} replicas against {', '.join(bounds)}",
                  title_style="bold")  # fmt: skip
    for column in ("replicas", "regions", "SLO attainment", "goodput (req/s)", "TTFT p90 (ms)"):
        table.add_column(column, justify="left" if column == "regions" else "right")
    for p in curve:
        ttft = p.summary.ttft_ms
        table.add_row(
            str(p.replicas),
            ", ".join(f"{region} {n}" for region, n in p.regions.items()),
            f"{p.attainment:.4f}" + (" ok" if p.attainment >= target else ""),
            f"{p.summary.goodput or 0.0:.2f}",
            "-" if ttft is None else f"{ttft.p90:.1f}",
        )
    return table


def curve_json(
    scenario: Scenario, pool: str, target: float, found: int | None, curve: Sequence[Point]
) -> dict[str, Any]:
    """--out's replicas.json: the answer (null when none) and every count run."""
    return {
        "pool": pool,
        "target": target,
        "slo": msgspec.to_builtins(scenario.slo),
        "replicas": found,
        "curve": [
            {
                "replicas": p.replicas,
                "regions": p.regions,
                "slo_attainment": p.attainment,
                "goodput": p.summary.goodput,
                "ttft_p90_ms": None if p.summary.ttft_ms is None else p.summary.ttft_ms.p90,
            }
            for p in curve
        ],
    }
