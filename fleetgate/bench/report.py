"""A finished run, shown: the table printed at the end and the files written to --out.

--out DIR gets `summary.json` ({"config": ..., "summary": ...}, the summary as
`fleetgate.bench.stats.Summary` names its fields) and, when asked, `requests.jsonl` with one
`RequestRecord` per line.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.table import Table

from fleetgate.bench.stats import Distribution, RequestRecord, Summary

SUMMARY_FILE = "summary.json"
RECORDS_FILE = "requests.jsonl"


def summary_table(summary: Summary, title: str = "fleetgate bench") -> Table:
    """The summary as a rich table: counts and rates, then one row per latency."""
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    for name in ("mean", "p50", "p90", "p99", "max"):
        table.add_column(name, justify="right")

    def add(label: str, value: str) -> None:
        table.add_row(label, value, "", "", "", "")

    add("duration", f"{summary.duration_s:.1f} s")
    add("requests", f"{summary.completed} ok / {summary.requests} sent")
    for kind, count in summary.errors.items():
        add(f"  error {kind}", str(count))
    add("request throughput", f"{summary.request_throughput:.2f} req/s")
    add("input throughput", f"{summary.input_throughput:.0f} tok/s")
    add("output throughput", f"{summary.output_throughput:.1f} tok/s")
    if summary.goodput is not None:
        bounds = [
            f"{label}<={value:g}ms"
            for label, value in (("ttft", summary.slo.ttft_ms), ("tpot", summary.slo.itl_ms))
            if value is not None
        ]
        attained = summary.slo_attainment or 0.0
        add(
            f"goodput ({' '.join(bounds)})",
            f"{summary.goodput:.2f} req/s ({attained:.1%} of sent)",
        )
    table.add_section()
    for label, dist in (
        ("TTFT (ms)", summary.ttft_ms),
        ("ITL (ms)", summary.itl_ms),
        ("TPOT (ms)", summary.tpot_ms),
        ("E2E (ms)", summary.e2e_ms),
    ):
        table.add_row(label, *_cells(dist))
    return table


def _cells(dist: Distribution | None) -> list[str]:
    if dist is None:
        return ["-"] * 5
    return [f"{v:.1f}" for v in (dist.mean, dist.p50, dist.p90, dist.p99, dist.max)]


def summary_json(summary: Summary, config: Mapping[str, Any]) -> dict[str, Any]:
    """The document written to summary.json."""
    return {"config": dict(config), "summary": dataclasses.asdict(summary)}


def record_json(record: RequestRecord) -> dict[str, Any]:
    """One line of requests.jsonl."""
    doc = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    doc["itl_s"] = [round(x, 6) for x in record.itl_s]
    return doc


def write_results(
    out_dir: Path,
    summary: Summary,
    config: Mapping[str, Any],
    records: Iterable[RequestRecord] | None = None,
) -> list[Path]:
    """Write summary.json (and requests.jsonl when `records` is given) into `out_dir`."""
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
    return written
