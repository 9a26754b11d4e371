"""A finished run, shown: the table printed at the end and the files written to --out.

--out DIR gets `summary.json` ({"config": ..., "summary": ...}, the summary as
`fleetgate.bench.stats.Summary` names its fields), when asked `requests.jsonl` with one
`RequestRecord` per line, and, when the target was a fleetgate gateway, `backends.json` with
its backends' samples (`fleetgate.bench.backends.backends_json`). --compare reads only
summary.json, so runs saved before backends.json existed compare as they are.
"""

from __future__ import annotations

import dataclasses
import json
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table

from fleetgate.bench.backends import BackendLoad, backends_json
from fleetgate.bench.stats import Distribution, RequestRecord, Summary

SUMMARY_FILE = "summary.json"
RECORDS_FILE = "requests.jsonl"
BACKENDS_FILE = "backends.json"


LATENCY_COLUMNS = ("mean", "p50", "p90", "p99", "max")


@dataclass(frozen=True, slots=True)
class TotalsRow:
    """One line of the counts-and-rates table, as the terminal and index.html show it."""

    label: str
    value: str
    is_error: bool = False


def totals_rows(summary: Summary) -> list[TotalsRow]:
    """Counts, rates and goodput, formatted."""
    rows = [
        TotalsRow("duration", f"{summary.duration_s:.1f} s"),
        TotalsRow("requests ok / sent", f"{summary.completed} / {summary.requests}"),
    ]
    rows += [TotalsRow(f"errors: {kind}", str(n), True) for kind, n in summary.errors.items()]
    rows += [
        TotalsRow("request throughput", f"{summary.request_throughput:.2f} req/s"),
        TotalsRow("input throughput", f"{summary.input_throughput:.0f} tok/s"),
        TotalsRow("output throughput", f"{summary.output_throughput:.1f} tok/s"),
    ]
    if summary.goodput is not None:
        bounds = [
            f"{label} <= {value:g} ms"
            for label, value in (("TTFT", summary.slo.ttft_ms), ("TPOT", summary.slo.itl_ms))
            if value is not None
        ]
        attained = summary.slo_attainment or 0.0
        rows.append(
            TotalsRow(
                f"goodput ({', '.join(bounds)})",
                f"{summary.goodput:.2f} req/s ({attained:.1%} of sent)",
            )
        )
    return rows


def latency_rows(summary: Summary) -> list[tuple[str, list[str]]]:
    """Each latency's name and its `LATENCY_COLUMNS` in ms, formatted ("-" when unmeasured)."""
    return [
        (label, _cells(dist))
        for label, dist in (
            ("TTFT", summary.ttft_ms),
            ("ITL", summary.itl_ms),
            ("TPOT", summary.tpot_ms),
            ("E2E", summary.e2e_ms),
        )
    ]


def summary_table(summary: Summary, title: str = "fleetgate bench") -> Group:
    """The summary as two rich tables: counts and rates, then the latency distributions."""
    totals = Table(title=title, show_header=False, title_style="bold")
    totals.add_column("metric")
    totals.add_column("value", justify="right")
    for row in totals_rows(summary):
        if row.is_error:
            totals.add_row(f"  {row.label}", f"[red]{row.value}[/]")
        else:
            totals.add_row(row.label, row.value)
    latencies = Table(header_style="bold")
    latencies.add_column("latency (ms)")
    for name in LATENCY_COLUMNS:
        latencies.add_column(name, justify="right")
    for label, cells in latency_rows(summary):
        latencies.add_row(label, *cells)
    return Group(totals, latencies)


def _cells(dist: Distribution | None) -> list[str]:
    if dist is None:
        return ["-"] * len(LATENCY_COLUMNS)
    return [f"{v:.1f}" for v in (dist.mean, dist.p50, dist.p90, dist.p99, dist.max)]


def summary_json(summary: Summary, config: Mapping[str, Any]) -> dict[str, Any]:
    """The document written to summary.json."""
    return {"config": dict(config), "summary": dataclasses.asdict(summary)}


def record_json(record: RequestRecord) -> dict[str, Any]:
    """One line of requests.jsonl."""
    doc = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    doc["itl_s"] = [round(x, 6) for x in record.itl_s]
    return doc


def read_records(path: Path) -> list[RequestRecord]:
    """A requests.jsonl written by `write_results`, back as records."""
    records = []
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        doc["itl_s"] = array("d", doc["itl_s"])
        records.append(RequestRecord(**doc))
    return records


def write_results(
    out_dir: Path,
    summary: Summary,
    config: Mapping[str, Any],
    records: Iterable[RequestRecord] | None = None,
    backends: BackendLoad | None = None,
) -> list[Path]:
    """Write summary.json into `out_dir`, requests.jsonl when `records` is given, and
    backends.json when `backends` holds samples."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = out_dir / SUMMARY_FILE
    summary_path.write_text(json.dumps(summary_json(summary, config), indent=2) + "\n")
    written = [summary_path]
    if records is not None:
        records_path = out_dir / RECORDS_FILE
        with records_path.open("w") as f:
            for record in records:
                f.write(json.dumps(record_json(record), separators=(",", ":")) + "\n")
        written.append(records_path)
    if backends is not None and backends.backends:
        backends_path = out_dir / BACKENDS_FILE
        backends_path.write_text(json.dumps(backends_json(backends), allow_nan=False) + "\n")
        written.append(backends_path)
    return written
