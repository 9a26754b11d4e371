"""index.html and the plots beside it: what --out writes for people to look at."""

from __future__ import annotations

import re
from pathlib import Path

from test_plots import assert_png, backend_load, run_records

from fleetgate.bench.backends import BackendLoad
from fleetgate.bench.page import INDEX_FILE, write_report
from fleetgate.bench.plots import BACKENDS, PLOTS
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


def test_the_page_shows_load_per_backend_or_why_it_cannot(tmp_path: Path) -> None:
    records = run_records()
    summary = summarize(records, 10.0, Slo())
    written = write_report(tmp_path / "a", summary, {}, records, "t", backend_load())
    assert [p.name for p in written] == [*(plot.file for plot in PLOTS), BACKENDS.file, INDEX_FILE]
    page = (tmp_path / "a" / INDEX_FILE).read_text()
    assert re.findall(r'<img src="([^"]+)"', page) == [p.file for p in (*PLOTS, BACKENDS)]
    assert 'href="backends.json"' in page
    assert "need a fleetgate gateway" not in page
    missing = BackendLoad({}, 1.0, "GET /metrics answered 404")
    write_report(tmp_path / "b", summary, {}, records, "t", missing)
    page = (tmp_path / "b" / INDEX_FILE).read_text()
    assert "backends.png" not in page
    assert "backends.json" not in page
    assert (
        "Load per backend is not shown: per-backend plots need a fleetgate gateway as the "
        "target (GET /metrics answered 404)." in page
    )
