"""The plots over time, drawn for real by matplotlib into PNG files."""

from __future__ import annotations

import random
import struct
import subprocess
import sys
from pathlib import Path

from fleetgate.bench.backends import BackendLoad, BackendSeries
from fleetgate.bench.plots import BACKENDS, PLOTS, write_backend_plot, write_plots
from fleetgate.bench.stats import RequestRecord
from fleetgate.bench.timeline import timeline

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_records(n: int = 200, seed: int = 0) -> list[RequestRecord]:
    """A small run: 20 req/s for n / 20 s, a few failures of two kinds."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        t = i / 20.0
        error = "http_503" if i % 17 == 0 else "timeout" if i % 29 == 0 else None
        records.append(
            RequestRecord(
                i, t, t, 100, 0 if error else 50, error=error,
                ttft_s=None if error else rng.uniform(0.05, 0.3), e2e_s=rng.uniform(0.5, 2.0),
            )
        )  # fmt: skip
    return records


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), path
    assert len(data) > 10_000, (path, len(data))  # drawn, not blank
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk comes first
    assert (width, height) == (900, 600)


def test_each_plot_is_a_real_png(tmp_path: Path) -> None:
    written = write_plots(tmp_path, timeline(run_records()))
    assert [p.name for p in written] == [plot.file for plot in PLOTS]
    for path in written:
        assert_png(path)


def backend_load() -> BackendLoad:
    """Two backends over 10 s: b is flagged from 4 s to 7 s and fails while it is, c appears
    at 6 s (added mid-run)."""
    t = [float(i) for i in range(11)]
    a = BackendSeries(t, [3.0] * 11, [True] * 11, [None, *[10.0] * 10], [None, *[0.0] * 10])
    b_healthy = [not 4 <= i < 7 for i in range(11)]
    b = BackendSeries(
        t, [2.0, 2, 2, 2, 0, 0, 0, 1, 2, 2, 2], list(b_healthy),
        [None, 8, 8, 8, 4, 1, 0, 5, 8, 8, 8], [None, 0, 0, 0, 3, 1, 0, 0, 0, 0, 0],
    )  # fmt: skip
    c = BackendSeries(t[6:], [1.0] * 5, [True] * 5, [0.0, 4, 6, 6, 6], [0.0] * 5)
    return BackendLoad({"10.0.0.1:8000": a, "10.0.0.2:8000": b, "10.0.0.3:8000": c}, 1.0)


def test_the_backend_plot_is_a_real_png(tmp_path: Path) -> None:
    path = write_backend_plot(tmp_path, backend_load(), end_s=10.5)
    assert path == tmp_path / BACKENDS.file
    assert_png(path)


def test_a_run_with_no_requests_still_draws(tmp_path: Path) -> None:
    for path in write_plots(tmp_path, timeline([])):
        assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_the_gateway_and_the_bench_flags_do_not_import_matplotlib() -> None:
    code = (
        "import sys, fleetgate.cli, fleetgate.bench.command, fleetgate.bench.page\n"
        "fleetgate.cli.build_parser()\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n"
    )
    root = Path(__file__).parents[2]  # `-c` imports from its working folder: this tree's
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root
    )
    assert done.returncode == 0, done.stderr
