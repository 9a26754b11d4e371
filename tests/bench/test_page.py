"""index.html and the plots beside it: what --out writes for people to look at."""

from __future__ import annotations

import re
from pathlib import Path

from test_plots import assert_png, run_records

from fleetgate.bench.page import INDEX_FILE, write_report
from fleetgate.bench.plots import PLOTS
from fleetgate.bench.report import SUMMARY_FILE
from fleetgate.bench.stats import Slo, summarize


def test_the_page_shows_every_plot_and_the_summary_tables(tmp_path: Path) -> None:
    records = run_records()
    summary = summarize(records, 10.0, Slo(ttft_ms=200.0))
    config = {"target": "http://127.0.0.1:9", "workload": "synthetic", "arrivals": {"rate": 20}}
    written = write_report(tmp_path / "run", summary, config, records, "bench <synthetic>")
    assert [p.name for p in written] == [*(plot.file for plot in PLOTS), INDEX_FILE]
    for path in written[:-1]:
        assert_png(path)
    page = (tmp_path / "run" / INDEX_FILE).read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert re.findall(r'<img src="([^"]+)"', page) == [plot.file for plot in PLOTS]
    assert "<h1>bench &lt;synthetic&gt;</h1>" in page  # escaped, not markup
    for needle in ("TTFT", "E2E", "goodput (TTFT &lt;= 200 ms)", "req/s", "errors: http_503"):
        assert needle in page, needle
    assert '<tr class="error"><td>errors: timeout</td><td class="num">6</td></tr>' in page
    assert "<code>{&quot;rate&quot;: 20}</code>" in page  # settings as JSON
    assert f'href="{SUMMARY_FILE}"' in page
    # Static: no script, and nothing it would fetch from elsewhere.
    assert "<script" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)
