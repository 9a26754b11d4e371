"""Saved runs side by side: what `fleetgate bench --compare DIR [DIR ...]` prints.

Each DIR is one that --out wrote; its summary.json is read back into a `stats.Summary`
(validated, so a damaged file is an error naming it). Every number of a later run is shown
with its ratio to the first run's: value / first value, so 0.50x on a latency is twice as fast
and 2.00x on a throughput twice as much.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from rich.table import Table

from fleetgate.bench.report import SUMMARY_FILE
from fleetgate.bench.stats import Distribution, Summary


class SavedRunError(ValueError):
    """A folder that holds no readable run; the message names it and what is wrong."""


@dataclass(frozen=True, slots=True)
class SavedRun:
    name: str  # the folder, as given
    config: dict[str, Any]
    summary: Summary


def load_run(folder: Path) -> SavedRun:
    """The run --out wrote into `folder`."""
    path = folder / SUMMARY_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SavedRunError(
            f"{folder}: no {SUMMARY_FILE}; pass folders that `fleetgate bench --out` wrote"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SavedRunError(f"{path}: cannot read it ({exc})") from None
    if not isinstance(doc, dict) or "summary" not in doc:
        raise SavedRunError(f'{path}: not a bench summary (it has no "summary")')
    try:
        return SavedRun(
            str(folder),
            msgspec.convert(doc.get("config", {}), dict[str, Any]),
            msgspec.convert(doc["summary"], Summary),
        )
    except msgspec.ValidationError as exc:
        raise SavedRunError(f"{path}: not a bench summary ({exc})") from None


Value = Callable[[Summary], float | None]


def _dist(name: str, field: str) -> Value:
    def value(summary: Summary) -> float | None:
        dist: Distribution | None = getattr(summary, name)
        return None if dist is None else float(getattr(dist, field))

    return value


# (label, value, format), in the end-of-run table's order: counts, errors by kind, then these.
COUNTS: tuple[tuple[str, Value, str], ...] = (
    ("duration (s)", lambda s: s.duration_s, "{:.1f}"),
    ("requests sent", lambda s: s.requests, "{:.0f}"),
    ("requests ok", lambda s: s.completed, "{:.0f}"),
)
RATES_AND_LATENCIES: tuple[tuple[str, Value, str], ...] = (
    ("request throughput (req/s)", lambda s: s.request_throughput, "{:.2f}"),
    ("input throughput (tok/s)", lambda s: s.input_throughput, "{:.0f}"),
    ("output throughput (tok/s)", lambda s: s.output_throughput, "{:.1f}"),
    ("goodput (req/s)", lambda s: s.goodput, "{:.2f}"),
    *(
        (f"{label} {q} (ms)", _dist(name, q), "{:.1f}")
        for label, name in (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("TPOT", "tpot_ms"))
        for q in ("p50", "p99")
    ),
    ("E2E p50 (ms)", _dist("e2e_ms", "p50"), "{:.1f}"),
    ("E2E p99 (ms)", _dist("e2e_ms", "p99"), "{:.1f}"),
)


def ratio(value: float | None, base: float | None) -> float | None:
    """value / base, or None when either is missing or base is 0."""
    if value is None or base is None or base == 0:
        return None
    return value / base


def compare_table(runs: Sequence[SavedRun], title: str = "fleetgate bench: saved runs") -> Table:
    """A row per number, a column per run; later runs' cells carry their ratio to the first.
    `title`: what the runs are (`fleetgate simulate --compare` names its scenario)."""
    table = Table(title=f"{title} (ratios to the first)", title_style="bold")
    table.add_column("")
    for run in runs:
        table.add_column(run.name, justify="right")
    table.add_row("workload", *(str(run.config.get("workload", "-")) for run in runs))
    table.add_row("target", *(str(run.config.get("target", "-")) for run in runs))
    kinds = dict.fromkeys(kind for run in runs for kind in run.summary.errors)
    errors = [(f"errors: {kind}", _errors_of(kind), "{:.0f}") for kind in kinds]
    for label, value, fmt in (*COUNTS, *errors, *RATES_AND_LATENCIES):
        first = value(runs[0].summary)
        later = (value(run.summary) for run in runs[1:])
        cells = [_cell(first, None, fmt), *(_cell(v, ratio(v, first), fmt) for v in later)]
        table.add_row(label, *cells)
    return table


def _errors_of(kind: str) -> Value:
    return lambda summary: summary.errors.get(kind, 0)


def _cell(value: float | None, times: float | None, fmt: str) -> str:
    if value is None:
        return "-"
    text = fmt.format(value)
    return text if times is None else f"{text} ({times:.2f}x)"
