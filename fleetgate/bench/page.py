"""A run's report for people: the plots over time and index.html showing them with the tables.

The page is static HTML with its style inline: no script, nothing fetched from the network, so
it opens from a saved folder or a CI artifact as it is. Its tables are the terminal's rows
(`report.totals_rows`, `report.latency_rows`), so both always say the same.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from fleetgate.bench.backends import BackendLoad, needs_gateway
from fleetgate.bench.plots import BACKENDS, PLOTS, Plot, write_backend_plot, write_plots
from fleetgate.bench.report import (
    BACKENDS_FILE,
    LATENCY_COLUMNS,
    SUMMARY_FILE,
    latency_rows,
    totals_rows,
)
from fleetgate.bench.stats import RequestRecord, Summary
from fleetgate.bench.timeline import timeline

INDEX_FILE = "index.html"
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 960px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.error td { color: #b00; }
figure { margin: 1.5em 0; }
img { max-width: 100%; }
code { font-size: 0.9em; }
"""


def write_report(
    out_dir: Path,
    summary: Summary,
    config: Mapping[str, Any],
    records: Sequence[RequestRecord],
    title: str,
    backends: BackendLoad | None = None,
) -> list[Path]:
    """Draw the plots and write index.html into `out_dir`; returns the files written.
    `backends`: what the gateway's /metrics said of each backend (None: not sampled)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = write_plots(out_dir, timeline(records))
    if backends is not None and backends.backends:
        written.append(write_backend_plot(out_dir, backends, summary.duration_s))
    index = out_dir / INDEX_FILE
    index.write_text(page_html(summary, config, title, backends), encoding="utf-8")
    return [*written, index]


def page_html(
    summary: Summary,
    config: Mapping[str, Any],
    title: str,
    backends: BackendLoad | None = None,
) -> str:
    """The whole index.html."""
    totals = "".join(
        table_row([row.label, row.value], "error" if row.is_error else None)
        for row in totals_rows(summary)
    )
    head = "".join(f"<th>{name}</th>" for name in LATENCY_COLUMNS)
    latencies = "".join(table_row([label, *cells]) for label, cells in latency_rows(summary))
    figures = "".join(figure_html(p) for p in PLOTS)
    # Where the reader looks for load per backend: its plot, or why there is none.
    data = f'<a href="{SUMMARY_FILE}">{SUMMARY_FILE}</a>'
    if backends is not None and backends.backends:
        per_backend = figure_html(BACKENDS)
        data += f', each backend\'s samples <a href="{BACKENDS_FILE}">{BACKENDS_FILE}</a>'
    else:
        per_backend = f"<p>{escape(needs_gateway(backends))}</p>"
    settings = "".join(
        f"<tr><td>{escape(key)}</td><td><code>{escape(_value(value))}</code></td></tr>"
        for key, value in config.items()
    )
    return f"""{page_head(title)}
<h2>Summary</h2>
<table>{totals}</table>
<table><tr><th>latency (ms)</th>{head}</tr>{latencies}</table>
<h2>Over time</h2>
{figures}
{per_backend}
<h2>Settings</h2>
<table>{settings}</table>
<p>The numbers as data: {data}.</p>
</body>
</html>
"""


def page_head(title: str) -> str:
    """A report page's start, to its <h1>: the bench's and the simulator's."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{escape(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>{escape(title)}</h1>"""


def figure_html(plot: Plot) -> str:
    return (
        f'<figure><img src="{escape(plot.file)}" alt="{escape(plot.caption)}">'
        f"<figcaption>{escape(plot.caption)}</figcaption></figure>"
    )


def table_row(cells: Sequence[str], css_class: str | None = None) -> str:
    """A table row: the first cell a label, the others numbers (aligned right)."""
    label, *numbers = (escape(cell) for cell in cells)
    tr = "<tr>" if css_class is None else f'<tr class="{css_class}">'
    return (
        tr + f"<td>{label}</td>" + "".join(f'<td class="num">{n}</td>' for n in numbers) + "</tr>"
    )


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
