"""`fleetgate top`: the live dashboard's view in a terminal, for an operator on a server. It
reads a gateway's GET /dashboard/snapshot once a second (with the admin key when auth is on)
and draws, with rich: the last ten seconds' rates and latencies, every backend's health and
load, each pool's objectives, each tenant's use and the last ejections.

    fleetgate top [--target http://127.0.0.1:8080] [--key KEY | $FLEETGATE_ADMIN_KEY] [--once]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

import msgspec
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from fleetgate.http.client import HttpClient, Origin
from fleetgate.http.errors import UpstreamError

_RECENT = 10  # seconds the headline figures are taken over
_VERDICT_STYLE = {"healthy": "green", "degraded": "yellow", "unhealthy": "bold red"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="http://127.0.0.1:8080", metavar="URL",
                        help="the gateway's base URL (http://127.0.0.1:8080)")  # fmt: skip
    parser.add_argument("--key", help="the admin key, when auth is on ($FLEETGATE_ADMIN_KEY)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between reads")
    parser.add_argument("--once", action="store_true", help="print one view and exit")


class TopError(Exception):
    """The gateway could not be read: the message says why and what to do."""


async def fetch(http: HttpClient, origin: Origin, key: str | None) -> dict[str, Any]:
    headers = [] if key is None else [(b"authorization", f"Bearer {key}".encode())]
    try:
        response = await http.request(origin, b"GET", b"/dashboard/snapshot", headers)
        body = await response.read()
    except (OSError, UpstreamError) as exc:
        raise TopError(f"cannot reach the gateway at {origin}: {exc}") from None
    if response.status == 401:
        raise TopError("the gateway needs its admin key: --key KEY or $FLEETGATE_ADMIN_KEY")
    if response.status == 404:
        raise TopError("the gateway serves no dashboard (server.dashboard: false)")
    if response.status != 200:
        raise TopError(f"the gateway answered {response.status}")
    snapshot: dict[str, Any] = msgspec.json.decode(body)
    return snapshot


async def run(args: argparse.Namespace) -> int:
    key = args.key or os.environ.get("FLEETGATE_ADMIN_KEY")
    origin = Origin.parse(args.target)
    http = HttpClient()
    console = Console()
    try:
        if args.once:
            console.print(render(await fetch(http, origin, key)))
            return 0
        with Live(console=console, auto_refresh=False, screen=False) as live:
            while True:
                live.update(render(await fetch(http, origin, key)), refresh=True)
                await asyncio.sleep(args.interval)
    except TopError as exc:
        console.print(f"[red]fleetgate top: {exc}[/red]")
        return 1
    finally:
        await http.close()


def render(snapshot: dict[str, Any]) -> Group:
    """One view of a snapshot (the shape of gateway/dashboard.py's Snapshot)."""
    parts: list[Any] = [_headline(snapshot)]
    for pool in snapshot["pools"]:
        parts.append(_backends(pool))
        if pool["slo"]:
            parts.append(_objectives(pool))
    if snapshot["tenants"]:
        parts.append(_tenants(snapshot["tenants"]))
    if snapshot["events"]:
        parts.append(_events(snapshot["events"]))
    return Group(*parts)


def _headline(snapshot: dict[str, Any]) -> Text:
    points = snapshot["points"][-_RECENT:]
    seconds = max(1, len(points))
    requests = sum(p["requests"] for p in points)
    errors = sum(p["errors"] for p in points)
    shed = sum(p["shed"] for p in points)
    last = points[-1] if points else {}
    in_flight = sum(b["in_flight"] for pool in snapshot["pools"] for b in pool["backends"])
    stamp = time.strftime("%H:%M:%S", time.localtime(snapshot["time"]))
    text = Text(f"fleetgate  {stamp}  up {snapshot['uptime_s']:.0f} s   ", style="bold")
    text.append(f"{requests / seconds:.1f} req/s   ")
    text.append(f"errors {errors / max(1, requests):.1%}   ", style="red" if errors else "")
    text.append(f"shed {shed / seconds:.1f}/s   ", style="yellow" if shed else "")
    text.append(f"TTFT p99 {_ms(last.get('ttft_p99'))}   E2E p99 {_ms(last.get('e2e_p99'))}   ")
    text.append(f"in flight {in_flight}")
    return text


def _backends(pool: dict[str, Any]) -> Table:
    queue = pool["admission"]
    title = escape(pool["model"])
    if queue is not None:
        title += f"  (admitted {queue['in_flight']} / limit {queue['limit']:.0f}, "
        title += f"waiting {queue['waiting']})"
    table = Table(title=title, title_justify="left", expand=True)
    for column in ("backend", "role", "state", "in flight", "engine run/wait", "KV", "TTFT",
                   "labels"):  # fmt: skip
        table.add_column(column)
    for b in pool["backends"]:
        state = Text(b["verdict"], style=_VERDICT_STYLE.get(b["verdict"], ""))
        for flag in b["flags"]:
            state.append(f" {flag.upper()}", style="bold red")
        if b["ejected_for_s"] is not None:
            state.append(f" back in {b['ejected_for_s']:.0f} s")
        engine = b["engine"]
        cells = [
            Text(f"{b['name']} {b['id']}"), b["role"], state, str(b["in_flight"]),
            "-" if engine is None else f"{engine['running']:.0f}/{engine['waiting']:.0f}",
            "-" if engine is None else f"{engine['kv_usage']:.0%}", _ms(b["ttft_s"]),
            Text(" ".join(f"{k}={v}" for k, v in sorted(b["labels"].items()))),
        ]  # fmt: skip
        table.add_row(*cells)  # one cell a column, in the columns' order
    return table


def _objectives(pool: dict[str, Any]) -> Table:
    table = Table(title=f"{escape(pool['model'])} objectives", title_justify="left", expand=True)
    for column in ("objective", "target", "now", "burn 5m", "burn 1h", "alerts"):
        table.add_column(column)
    for o in pool["slo"]:
        ratio = o["kind"] == "ratio"
        target = f"{o['target']:.2%}" if ratio else f"{o['target']:g} s"
        value = o["value"]
        now = "-" if value is None else (f"{value:.2%}" if ratio else f"{value:.2f} s")
        burn = o["burn"]
        style = "" if o["met"] and not o["alerts"] else "bold red"
        table.add_row(
            o["name"], target, Text(now, style=style), _burn(burn.get("5m")),
            _burn(burn.get("1h")), Text(" ".join(o["alerts"]).upper(), style="bold red"),
        )  # fmt: skip
    return table


def _tenants(tenants: Sequence[dict[str, Any]]) -> Table:
    table = Table(title="tenants", title_justify="left", expand=True)
    for column in ("tenant", "requests", "prompt tokens", "completion tokens", "spend"):
        table.add_column(column)
    for t in tenants:
        table.add_row(Text(t["tenant"]), str(t["requests"]), str(t["prompt_tokens"]),
                      str(t["completion_tokens"]), f"${t['spend_usd']:.4f}")  # fmt: skip
    return table


def _events(events: Sequence[dict[str, Any]]) -> Table:
    table = Table(title="recent ejections", title_justify="left", expand=True)
    for column in ("time", "backend", "why", "for"):
        table.add_column(column)
    for e in reversed(events[-5:]):
        stamp = time.strftime("%H:%M:%S", time.localtime(e["time"]))
        table.add_row(
            stamp, Text(f"{e['model']} {e['backend']}"), e["reason"], f"{e['for_s']:.0f} s"
        )
    return table


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _burn(rate: float | None) -> Text:
    if rate is None:
        return Text("-")
    return Text(f"{rate:.1f}x", style="bold red" if rate >= 1 else "")
