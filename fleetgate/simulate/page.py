"""What `fleetgate simulate --out` writes for people: timeline.json, the report over time
(simulate/report.py) drawn as PNGs, and index.html showing them with the run's tables.

The bench's figure and page are reused (bench/plots.py, bench/page.py): the same size, style
and tables, matplotlib imported only when a figure is drawn. Every plot marks the scenario's
events with a dashed vertical line labelled with the event's kind and place.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetgate.bench.page import INDEX_FILE, figure_html, page_head, table_row
from fleetgate.bench.plots import Plot, new_figure, save_figure
from fleetgate.bench.report import (
    LATENCY_COLUMNS,
    RECORDS_FILE,
    SUMMARY_FILE,
    latency_rows,
    totals_rows,
)
from fleetgate.bench.stats import Summary
from fleetgate.simulate.report import (
    RECOVERED_AVAILABILITY,
    RECOVERED_RUN,
    TIMELINE_FILE,
    Capacity,
    FleetTimeline,
    Window,
    capacity,
    happened,
    timeline,
    timeline_json,
)
from fleetgate.simulate.run import Outcome
from fleetgate.simulate.scenario import EventSpec, Scenario

if TYPE_CHECKING:
    from matplotlib.axes import Axes

THROUGHPUT = Plot("throughput.png", "Throughput and goodput: successful requests/s as they end")
AVAILABILITY = Plot("availability.png", "Availability: the share of requests sent that succeeded")
TTFT = Plot("ttft.png", "TTFT p99 of the successful requests sent in each window")
REPLICAS = Plot("replicas.png", "Replicas and GPUs up in each region")
PLOTS = (THROUGHPUT, AVAILABILITY, TTFT, REPLICAS)
# Events in shades the series' colours (matplotlib's C0, C1, ...) are not: (colour, line).
_EVENT_STYLES = {"crash": ("#b00", "--"), "recover": ("#555", ":")}
_OTHER_EVENT = ("#555", "-.")  # slowdown, add, remove, surge
ALL = "all"  # the series of every client, and the whole fleet's capacity


@dataclass(frozen=True, slots=True)
class Panel:
    """One axes of a plot: a value of each window, drawn as a line per series."""

    ylabel: str
    value: Callable[[Window], float | None]
    empty: str = "no samples"  # said where no window has a value


def _percent(share: float | None) -> float | None:
    return None if share is None else 100.0 * share


_LINES = (
    (THROUGHPUT, (Panel("throughput (req/s)", lambda w: w.throughput),
                  Panel("goodput (req/s)", lambda w: w.goodput, "no SLO in the scenario"))),
    (AVAILABILITY, (Panel("availability (%)", lambda w: _percent(w.availability)),)),
    (TTFT, (Panel("TTFT p99 (ms)", lambda w: w.ttft_p99_ms),)),
)  # fmt: skip


def write_report(
    out_dir: Path, scenario: Scenario, outcome: Outcome, summaries: Mapping[str, Summary]
) -> list[Path]:
    """Write timeline.json, the plots and index.html into `out_dir` (beside the summary.json
    and requests.jsonl the command writes); returns the files written. `summaries`: the
    command's tables (all clients, then each region's)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    line = timeline(scenario, outcome)
    doc = timeline_json(scenario, outcome, line)
    path = out_dir / TIMELINE_FILE
    path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    written = [path, *write_plots(out_dir, scenario, outcome, line)]
    index = out_dir / INDEX_FILE
    index.write_text(page_html(scenario, summaries, doc), encoding="utf-8")
    return [*written, index]


def write_plots(
    out_dir: Path, scenario: Scenario, outcome: Outcome, line: FleetTimeline
) -> list[Path]:
    """Draw `PLOTS` into `out_dir`: lines by window for all clients, then each region's when
    more than one region sent requests; capacity as the steps it took."""
    regions = [(n, s) for n, s in line.regions.items() if any(w.sent for w in s)]
    series = dict([(ALL, line.all_clients), *(regions if len(regions) > 1 else [])])
    x = [w.start_s + line.window_s / 2 for w in line.all_clients]
    # A region has one colour in every plot.
    colors = {name: f"C{i % 10}" for i, name in enumerate([ALL, *line.regions])}
    events = happened(outcome)
    written = []
    for plot, panels in _LINES:
        figure = new_figure()
        axes = list(figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0])
        for a, panel in zip(axes, panels, strict=True):
            _panel(a, panel, x, series, colors)
        _time_axis(axes, events, outcome.end_s)
        written.append(save_figure(figure, out_dir, plot))
    figure = new_figure()
    axes = list(figure.subplots(2, 1, sharex=True))
    fleet, by_region = capacity(scenario, outcome)
    shown = {ALL: fleet, **by_region} if len(by_region) > 1 else by_region
    _capacity(axes, shown, colors, outcome.end_s)
    _time_axis(axes, events, outcome.end_s)
    return [*written, save_figure(figure, out_dir, REPLICAS)]


def _panel(
    axes: Axes, panel: Panel, x: Sequence[float], series: Mapping[str, Sequence[Window]],
    colors: Mapping[str, str],
) -> None:  # fmt: skip
    """One line a series, through each window's middle; a gap where a window has no value."""
    values = {name: [panel.value(w) for w in windows] for name, windows in series.items()}
    for name, ys in values.items():
        axes.plot(x, [math.nan if y is None else y for y in ys], marker=".", label=name,
                  color=colors[name])  # fmt: skip
    if all(y is None for ys in values.values() for y in ys):
        axes.text(0.5, 0.5, panel.empty, ha="center", va="center", transform=axes.transAxes)
    _style(axes, panel.ylabel)


def _capacity(
    axes: Sequence[Axes], shown: Mapping[str, Capacity], colors: Mapping[str, str], end_s: float
) -> None:
    """Replicas (top) and GPUs (bottom) up, as the steps they took, to the run's end."""
    for name, up in shown.items():
        if up.at_s:
            at = [*up.at_s, end_s]
            axes[0].step(at, [*up.replicas, up.replicas[-1]], where="post", label=name,
                         color=colors[name])  # fmt: skip
            axes[1].step(at, [*up.gpus, up.gpus[-1]], where="post", label=name,
                         color=colors[name])  # fmt: skip
    _style(axes[0], "replicas up")
    _style(axes[1], "GPUs up")


def _time_axis(axes: Sequence[Axes], events: Sequence[EventSpec], end_s: float) -> None:
    """The shared time axis to the run's end, named, with each event a line on every axes,
    labelled with its kind and place along the top."""
    axes[-1].set_xlabel("simulated seconds")
    axes[-1].set_xlim(0, max(end_s, 1e-9))
    for event in events:
        color, style = _EVENT_STYLES.get(event.kind, _OTHER_EVENT)
        for a in axes:
            a.axvline(event.at_s, color=color, linestyle=style, linewidth=1)
        axes[0].text(
            event.at_s, 0.98, f"{_where(event)} ", transform=axes[0].get_xaxis_transform(),
            rotation=90, ha="right", va="top", fontsize="small", color=color,
        )  # fmt: skip


def _style(axes: Axes, ylabel: str) -> None:
    axes.set_ylabel(ylabel)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    # Beside the axes, not over them: the events' labels run along their top.
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")


def _where(event: EventSpec) -> str:
    """An event's label: its kind, its region (and zone), a slowdown's or surge's factor."""
    place = event.region if event.zone is None else f"{event.region}/{event.zone}"
    factor = f" x{event.factor:g}" if event.kind in ("slowdown", "surge") else ""
    return f"{event.kind} {place}".rstrip() + factor


def page_html(scenario: Scenario, summaries: Mapping[str, Summary], doc: Mapping[str, Any]) -> str:
    """The whole index.html: the command's tables, the failovers, GPU-hours, the plots.
    `doc`: timeline.json's document, so the page and the file say the same."""
    title = f"{scenario.name}: simulated"
    head = "".join(f"<th>{name}</th>" for name in LATENCY_COLUMNS)
    tables = "".join(
        f"<h3>{escape(label)}</h3><table>"
        + "".join(table_row([r.label, r.value], "error" if r.is_error else None)
                  for r in totals_rows(summary))
        + f"</table><table><tr><th>latency (ms)</th>{head}</tr>"
        + "".join(table_row([name, *cells]) for name, cells in latency_rows(summary))
        + "</table>"
        for label, summary in summaries.items()
    )  # fmt: skip
    failovers = "".join(_failover_row(f) for f in doc["failovers"])
    if not failovers:
        failovers = table_row(["no crash in the scenario", "", "", ""])
    regions = doc["regions"]
    gpu_rows = "".join(
        table_row([name, f"{series[-1]['gpu_s'] / 3600:,.3f}"]) for name, series in regions.items()
    )
    figures = "".join(figure_html(p) for p in PLOTS)
    data = ", ".join(f'<a href="{f}">{f}</a>' for f in (TIMELINE_FILE, SUMMARY_FILE, RECORDS_FILE))
    return f"""{page_head(title)}
<p>{doc["duration_s"]:,.0f} s of sending, {doc["end_s"]:,.0f} s to the last answer,
{doc["gpu_hours"]:,.3f} GPU-hours.</p>
<h2>Summary</h2>
{tables}
<h2>Failovers</h2>
<p>Time from a crash to the end of the first request its region's clients sent from then on
that succeeded, it and the {RECOVERED_RUN - 1} sent after it at least
{RECOVERED_AVAILABILITY:.0%} available.</p>
<table><tr><th>at</th><th>event</th><th>replicas</th><th>served again after</th></tr>
{failovers}</table>
<h2>GPU-hours</h2>
<table><tr><th>region</th><th>GPU-hours</th></tr>{gpu_rows}
{table_row(["all", f"{doc['gpu_hours']:,.3f}"])}</table>
<h2>Over time</h2>
<p>By windows of {doc["window_s"]:g} s: latencies and availability of the requests sent in
each, throughput and goodput of those that ended in it.</p>
{figures}
<p>The numbers as data: {data}.</p>
</body>
</html>
"""


def _failover_row(failover: Mapping[str, Any]) -> str:
    """A row of the failovers table from timeline.json's entry."""
    place = failover["region"] if failover["zone"] is None else (
        f"{failover['region']}/{failover['zone']}")  # fmt: skip
    replicas = "all" if failover["replicas"] is None else str(failover["replicas"])
    served = failover["served_again_s"]
    after = "not by the end" if served is None else f"{served:.1f} s"
    return table_row([f"{failover['at_s']:g} s", f"crash {place}", replicas, after])
