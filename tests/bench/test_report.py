"""The end-of-run table and the files written to --out."""

from __future__ import annotations

import io
import json
from array import array
from pathlib import Path

from rich.console import Console

from fleetgate.bench.report import (
    RECORDS_FILE,
    SUMMARY_FILE,
    read_records,
    summary_table,
    write_results,
)
from fleetgate.bench.stats import RequestRecord, Slo, summarize

RECORDS = [
    RequestRecord(0, 0.0, 0.001, 10, 3, ttft_s=0.1, itl_s=array("d", [0.01, 0.02]), e2e_s=0.13),
    RequestRecord(1, 0.5, 0.5, 10, 0, error="http_503", e2e_s=0.01),
]


def test_summary_json_has_config_and_summary(tmp_path: Path) -> None:
    summary = summarize(RECORDS, 2.0, Slo(ttft_ms=500.0, itl_ms=50.0))
    paths = write_results(tmp_path / "run", summary, {"workload": "synthetic"}, RECORDS)
    assert [p.name for p in paths] == [SUMMARY_FILE, RECORDS_FILE]
    doc = json.loads((tmp_path / "run" / SUMMARY_FILE).read_text())
    assert doc["config"] == {"workload": "synthetic"}
    s = doc["summary"]
    assert s["requests"] == 2
    assert s["completed"] == 1
    assert s["errors"] == {"http_503": 1}
    assert s["slo"] == {"ttft_ms": 500.0, "itl_ms": 50.0}
    assert s["goodput"] == 0.5
    assert set(s["ttft_ms"]) == {"count", "mean", "p50", "p90", "p99", "max"}
    assert s["ttft_ms"]["p50"] == 100.0
    assert set(s) >= {"duration_s", "request_throughput", "output_throughput", "itl_ms", "e2e_ms"}
    lines = (tmp_path / "run" / RECORDS_FILE).read_text().splitlines()
    assert [json.loads(line)["error"] for line in lines] == [None, "http_503"]
    assert json.loads(lines[0])["itl_s"] == [0.01, 0.02]


def test_records_file_is_optional(tmp_path: Path) -> None:
    summary = summarize(RECORDS, 2.0, Slo())
    assert [p.name for p in write_results(tmp_path, summary, {})] == [SUMMARY_FILE]
    assert json.loads((tmp_path / SUMMARY_FILE).read_text())["summary"]["goodput"] is None


def test_table_shows_throughput_latencies_errors_and_goodput() -> None:
    out = io.StringIO()
    summary = summarize(RECORDS, 2.0, Slo(ttft_ms=500.0))
    Console(file=out, width=120).print(summary_table(summary))
    text = out.getvalue()
    for needle in ("latency (ms)", "TTFT", "ITL", "E2E", "http_503", "req/s", "goodput", "100.0"):
        assert needle in text, needle


def test_records_read_back_as_written(tmp_path: Path) -> None:
    write_results(tmp_path, summarize(RECORDS, 1.0, Slo()), {}, RECORDS)
    assert read_records(tmp_path / RECORDS_FILE) == RECORDS
