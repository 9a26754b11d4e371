"""--compare: saved runs read back and shown side by side with ratios to the first."""

from __future__ import annotations

import io
import json
from array import array
from pathlib import Path

import pytest
from rich.console import Console

from fleetgate.bench.compare import SavedRunError, compare_table, load_run, ratio
from fleetgate.bench.report import SUMMARY_FILE, write_results
from fleetgate.bench.stats import RequestRecord, Slo, summarize


def save(folder: Path, ttft_s: float, n_ok: int, errors: int, workload: str) -> Path:
    """A run of 10 s: n_ok successes of TTFT `ttft_s` (e2e twice that), `errors` 503s."""
    ok = [
        RequestRecord(i, 0.0, 0.0, 10, 4, ttft_s=ttft_s, itl_s=array("d", [0.01] * 3),
                      e2e_s=2 * ttft_s)
        for i in range(n_ok)
    ]  # fmt: skip
    failed = [RequestRecord(n_ok + i, 0.0, 0.0, 10, 0, error="http_503") for i in range(errors)]
    records = ok + failed
    write_results(folder, summarize(records, 10.0, Slo()), {"workload": workload, "target": "t"})
    return folder


def table_text(folders: list[Path]) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(compare_table([load_run(f) for f in folders]))
    return out.getvalue()


def row(text: str, label: str) -> list[str]:
    """The cells of the row starting with `label`, split on the table's bars."""
    line = next(line for line in text.splitlines() if line.lstrip("│ ").startswith(label))
    return [cell.strip() for cell in line.strip("│").split("│")][1:]


def test_later_runs_carry_their_ratio_to_the_first(tmp_path: Path) -> None:
    base = save(tmp_path / "base", ttft_s=0.2, n_ok=20, errors=0, workload="synthetic")
    fast = save(tmp_path / "fast", ttft_s=0.1, n_ok=30, errors=2, workload="synthetic")
    text = table_text([base, fast])
    assert str(base) in text and str(fast) in text
    assert row(text, "request throughput") == ["2.00", "3.00 (1.50x)"]
    assert row(text, "TTFT p50") == ["200.0", "100.0 (0.50x)"]
    assert row(text, "E2E p99") == ["400.0", "200.0 (0.50x)"]
    assert row(text, "requests sent") == ["20", "32 (1.60x)"]
    assert row(text, "errors: http_503") == ["0", "2"]  # no ratio to nothing
    assert row(text, "goodput") == ["-", "-"]  # neither run had an SLO
    assert row(text, "workload") == ["synthetic", "synthetic"]


def test_ratio_is_none_without_a_base() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(3.0, 0.0) is None
    assert ratio(None, 2.0) is None
    assert ratio(3.0, None) is None


def test_folders_without_a_run_are_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(SavedRunError, match=r"empty: no summary\.json"):
        load_run(tmp_path / "empty")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / SUMMARY_FILE).write_text("{not json")
    with pytest.raises(SavedRunError, match=r"junk/summary\.json: cannot read it"):
        load_run(tmp_path / "junk")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / SUMMARY_FILE).write_text(json.dumps({"summary": {"requests": "x"}}))
    with pytest.raises(SavedRunError, match=r"other/summary\.json: not a bench summary"):
        load_run(tmp_path / "other")
