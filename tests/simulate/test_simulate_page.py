"""`fleetgate simulate --out`'s report over time (simulate/page.py): timeline.json, the plots
and index.html, from a run with a region outage."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from fleetgate.cli import main
from fleetgate.simulate.page import PLOTS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_out_writes_the_timeline_the_plots_and_the_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One region, its two replicas down from 4 s to 7 s: requests sent meanwhile fail.
    path = tmp_path / "s.yaml"
    data = {"name": "outage", "regions": [{"name": "r", "pools": [{"model": "m", "replicas": 2}]}],
            "workload": {"name": "mooncake-conv", "max_requests": 50},
            "gateway": {"pools": [{"model": "m"}]}, "slo": {"ttft_ms": 2000},
            "events": [{"at_s": 4, "kind": "crash", "region": "r"},
                       {"at_s": 7, "kind": "recover", "region": "r"}]}  # fmt: skip
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", str(path), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    for name in ("timeline.json", *(p.file for p in PLOTS), "index.html"):
        assert f"wrote {out / name}" in said.replace("\n", ""), name

    doc = json.loads((out / "timeline.json").read_text())
    assert doc["window_s"] == 10.0
    windows = doc["regions"]["r"]
    assert doc["all"] == windows  # one region: its clients are all of them
    assert sum(w["sent"] for w in windows) == 50
    assert [w["replicas_up"] for w in windows] == [0, 2]  # down for part of the first window
    assert 0 < windows[0]["availability"] < 1
    assert windows[-1]["gpu_s"] == pytest.approx(doc["gpu_hours"] * 3600)
    # 2 GPUs for all of the run but the 3 s outage.
    assert doc["gpu_hours"] * 3600 == pytest.approx(2 * (doc["end_s"] - 3))
    (failover,) = doc["failovers"]
    assert failover["at_s"] == 4 and failover["region"] == "r"
    assert failover["served_again_s"] > 3  # not before the replicas came back at 7 s
    assert [e["kind"] for e in doc["events"]] == ["crash", "recover"]

    for plot in PLOTS:
        png = (out / plot.file).read_bytes()
        assert png.startswith(PNG_SIGNATURE) and len(png) > 10_000, plot.file
    page = (out / "index.html").read_text()
    assert re.findall(r'<img src="([^"]+)"', page) == [p.file for p in PLOTS]
    assert "<h3>all clients</h3>" in page and "errors: http_" in page
    served = f"{failover['served_again_s']:.1f} s"
    assert f'<td class="num">crash r</td><td class="num">all</td><td class="num">{served}' in page
    assert f"{doc['gpu_hours']:,.3f} GPU-hours" in page
    assert 'href="timeline.json"' in page and "<script" not in page
