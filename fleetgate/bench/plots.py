"""A run's plots over time, as PNG files: latency, throughput, load with errors, and (from a
fleetgate gateway's /metrics) load on each backend.

matplotlib is imported when a figure is made (`new_figure`), not at the top: only a report
needs it, so `fleetgate serve` and a bench run without --out never load it. Figures are drawn
with the Agg canvas directly (no pyplot), so nothing here needs a display or touches global
state. The simulator's report (simulate/page.py) draws its figures with the same helpers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleetgate.bench.backends import BackendLoad, BackendSeries
from fleetgate.bench.timeline import Timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass(frozen=True, slots=True)
class Plot:
    file: str
    caption: str


LATENCY = Plot("latency.png", "TTFT and E2E p50 and p99, by the window each request was sent in")
THROUGHPUT = Plot("throughput.png", "Completed requests and output tokens per second")
LOAD = Plot("load.png", "Requests in flight, and errors per second by kind")
PLOTS = (LATENCY, THROUGHPUT, LOAD)
BACKENDS = Plot(
    "backends.png",
    "Requests in flight and answers per second on each backend, as the gateway counted them",
)
_SIZE_IN = (9.0, 6.0)
_DPI = 100


def write_plots(out_dir: Path, line: Timeline) -> list[Path]:
    """Draw the run's plots into `out_dir`; returns the files written, in `PLOTS` order."""
    mids = [s + line.width_s / 2 for s in line.starts_s]
    written = []
    for plot, draw in ((LATENCY, _latency), (THROUGHPUT, _throughput), (LOAD, _load)):
        figure = new_figure()
        top, bottom = figure.subplots(2, 1, sharex=True)
        draw(top, bottom, mids, line)
        bottom.set_xlabel(f"seconds into the run ({line.width_s:g} s windows)")
        written.append(save_figure(figure, out_dir, plot))
    return written


def write_backend_plot(out_dir: Path, load: BackendLoad, end_s: float) -> Path:
    """Draw `BACKENDS` into `out_dir`: in flight per backend with its unhealthy stretches
    shaded (top), answers/s per backend with errors/s marked (bottom). `end_s`: the run's
    length, where an unhealthy stretch still open at the last scrape ends."""
    figure = new_figure()
    top, bottom = figure.subplots(2, 1, sharex=True)
    for i, (name, series) in enumerate(sorted(load.backends.items())):
        _backend(top, bottom, name, series, f"C{i % 10}", end_s)
    top.set_ylabel("requests in flight")
    bottom.set_ylabel("answers/s (x: errors/s)")
    bottom.set_xlabel(
        f"seconds into the run (the gateway's /metrics read every {load.interval_s:g} s)"
    )
    for axes in (top, bottom):
        axes.set_ylim(bottom=0)
        axes.set_xlim(left=0)
        axes.grid(alpha=0.3)
        # Beside the axes, not over them: a fleet's legend can be long.
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return save_figure(figure, out_dir, BACKENDS)


def _backend(
    top: Axes, bottom: Axes, name: str, series: BackendSeries, color: str, end_s: float
) -> None:
    top.plot(series.at_s, _gaps(series.in_flight), marker=".", color=color, label=name)
    for i, (start, end) in enumerate(series.unhealthy_spans(end_s)):
        top.axvspan(
            start, end, color=color, alpha=0.15, hatch="//",
            label=f"{name} unhealthy" if i == 0 else None,
        )  # fmt: skip
    bottom.plot(series.at_s, _gaps(series.answers_per_s), marker=".", color=color, label=name)
    failed = [(t, r) for t, r in zip(series.at_s, series.errors_per_s, strict=True) if r]
    if failed:
        times, rates = zip(*failed, strict=True)
        bottom.plot(
            times, rates, linestyle="none", marker="x", markersize=8, color=color,
            label=f"{name} errors",
        )  # fmt: skip


def _gaps(values: Sequence[float | None]) -> list[float]:
    """None as NaN: a gap in the line where a scrape lacked the backend."""
    return [float("nan") if v is None else v for v in values]


def new_figure() -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=_SIZE_IN, dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save_figure(figure: Figure, out_dir: Path, plot: Plot) -> Path:
    figure.suptitle(plot.caption, fontsize="medium")
    path = out_dir / plot.file
    figure.savefig(path)
    return path


def _latency(top: Axes, bottom: Axes, x: Sequence[float], line: Timeline) -> None:
    _lines(top, x, "TTFT (ms)", p50=line.ttft_p50_ms, p99=line.ttft_p99_ms)
    _lines(bottom, x, "E2E (ms)", p50=line.e2e_p50_ms, p99=line.e2e_p99_ms)


def _throughput(top: Axes, bottom: Axes, x: Sequence[float], line: Timeline) -> None:
    rates = {"completed": line.completed_per_s, "sent (offered)": line.sent_per_s}
    _lines(top, x, "requests/s", **rates)
    _lines(bottom, x, "output tokens/s", output=line.output_tokens_per_s)


def _load(top: Axes, bottom: Axes, x: Sequence[float], line: Timeline) -> None:
    top.step(x, line.in_flight, where="mid", label="in flight")
    top.set_ylabel("requests in flight")
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    _errors(bottom, x, line)


def _lines(axes: Axes, x: Sequence[float], ylabel: str, **series: Sequence[float]) -> None:
    for label, values in series.items():
        axes.plot(x, values, marker=".", label=label)
    axes.set_ylabel(ylabel)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", fontsize="small")


def _errors(axes: Axes, x: Sequence[float], line: Timeline) -> None:
    """Errors per second, one stacked bar segment per kind."""
    axes.set_ylabel("errors/s")
    axes.grid(alpha=0.3)
    if not line.errors_per_s:
        axes.text(0.5, 0.5, "no errors", ha="center", va="center", transform=axes.transAxes)
        return
    base = [0.0] * len(x)
    for kind, rates in line.errors_per_s.items():
        axes.bar(x, rates, width=line.width_s * 0.9, bottom=base, label=kind)
        base = [b + r for b, r in zip(base, rates, strict=True)]
    axes.legend(loc="upper left", fontsize="small")
