"""`fleetgate bench`: its flags, and the run from flags to table and files.

fleetgate's cli.py adds the subcommand with `add_arguments` and calls `run` (async) or `main`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from fleetgate.bench.backends import NEEDS_GATEWAY, BackendLoad, BackendSampler
from fleetgate.bench.compare import SavedRunError, compare_table, load_run
from fleetgate.bench.config import (
    DEFAULT_RATE,
    WORKLOADS,
    BenchConfig,
    WorkloadName,
    build_workload,
    default_lengths,
)
from fleetgate.bench.generated import LENGTH_KINDS, LengthDist, SharedPrefixShape
from fleetgate.bench.page import write_report
from fleetgate.bench.progress import ProgressBar
from fleetgate.bench.report import summary_table, write_results
from fleetgate.bench.runner import LoadGenerator, LoadSettings
from fleetgate.bench.stats import Slo, summarize
from fleetgate.bench.tracefile import check_trace
from fleetgate.bench.traces import TRACE_SOURCES
from fleetgate.bench.workloads import ENDPOINTS, Arrivals, Bursts, PoissonArrivals, TraceTimes
from fleetgate.fleet.discovery import DiscoveryError, list_models
from fleetgate.http.client import HttpClient, Origin

_SHAPE = SharedPrefixShape()
_LAG_WARNING_S = 0.1  # a send this late means the generator, not the server, set the pace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `fleetgate bench`."""
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--target", metavar="URL", help="server base URL, e.g. http://host:8080")
    mode.add_argument(
        "--compare",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="show runs saved with --out side by side, with ratios to the first; sends nothing",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="azure-conv",
        metavar="W",
        help=f"one of {', '.join(WORKLOADS)} (azure-conv)",
    )
    source.add_argument(
        "--trace",
        type=Path,
        metavar="FILE",
        help="replay your own trace instead: an Azure LLM inference trace CSV (a header with "
        "TIMESTAMP, ContextTokens, GeneratedTokens; TIMESTAMP a date and time or seconds) or "
        'a Mooncake JSONL ({"timestamp": ms, "input_length": n, "output_length": n, '
        '"hash_ids": [...]} a line; rows sharing hash ids share 512-token prompt blocks), '
        "told apart by the extension (.csv, .jsonl) or the first line; rows in time order",
    )
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument(
        "--rate",
        type=float,
        metavar="R",
        help="Poisson arrivals at R req/s ('inf': all at once); "
        "trace workloads then keep only their lengths (default for generated workloads: 10)",
    )
    pace.add_argument(
        "--trace-speed",
        type=float,
        metavar="X",
        help="replay trace times X times faster (default 1)",
    )
    parser.add_argument(
        "--duration", type=float, default=60.0, metavar="S", help="seconds of sending (60)"
    )
    parser.add_argument(
        "--max-requests", type=int, metavar="N", help="stop sending after N requests"
    )
    parser.add_argument(
        "--grace",
        type=float,
        metavar="S",
        default=30.0,
        help="seconds in-flight requests "
        "may take after sending stops, then they count as timeouts (30)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of prompts and arrivals (0)")
    parser.add_argument("--model", help="model name (default: the first the server lists)")
    parser.add_argument("--endpoint", choices=ENDPOINTS, default="chat")
    parser.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="ask for whole responses (no TTFT or ITL)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="bearer token (default: $OPENAI_API_KEY)",
    )
    parser.add_argument("--slo-ttft-ms", type=float, help="goodput bound on TTFT")
    parser.add_argument(
        "--slo-itl-ms",
        type=float,
        help="goodput bound on each request's mean inter-token latency (TPOT)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write summary.json, plots over time (PNG) and index.html showing them here",
    )
    parser.add_argument(
        "--save-requests",
        action="store_true",
        help="with --out, also write every request as requests.jsonl",
    )
    parser.add_argument("--quiet", action="store_true", help="no live progress bar")
    shared = parser.add_argument_group("shared-prefix workload (SGLang's defaults)")
    shared.add_argument("--groups", type=int, default=_SHAPE.groups, help="(64)")
    shared.add_argument(
        "--prompts-per-group", type=int, default=_SHAPE.prompts_per_group, help="(16)"
    )
    shared.add_argument(
        "--system-prompt-len",
        type=int,
        default=_SHAPE.system_prompt_len,
        help="tokens shared by a group (2048)",
    )
    shared.add_argument(
        "--question-len",
        type=int,
        default=_SHAPE.question_len,
        help="tokens unique to each prompt (128)",
    )
    lengths = parser.add_argument_group("synthetic and code-completion workloads")
    lengths.add_argument(
        "--input-len", type=int, help="mean prompt tokens (synthetic 1024, code-completion 2000)"
    )
    lengths.add_argument(
        "--output-len",
        type=int,
        help=f"mean output tokens (synthetic 128, code-completion 30, shared-prefix"
        f" {_SHAPE.output_len})",
    )
    lengths.add_argument(
        "--length-dist",
        choices=LENGTH_KINDS,
        help="of input and output lengths (synthetic fixed, code-completion uniform)",
    )
    lengths.add_argument(
        "--range-ratio",
        type=float,
        help="uniform: lengths in mean * [1 - r, 1 + r] (synthetic 0, code-completion 0.5)",
    )
    lengths.add_argument(
        "--burst-size",
        type=float,
        help="send requests in bursts of this many on average, at --rate on average"
        " (code-completion 8; others 1: plain Poisson arrivals)",
    )
    lengths.add_argument(
        "--burst-spread",
        type=float,
        metavar="S",
        help="a burst's requests are sent over this many seconds (1)",
    )


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The validated config; raises ValueError naming the bad flag's value."""
    workload: WorkloadName = "trace" if args.trace is not None else args.workload
    arrivals: Arrivals | None = None
    burst = {name: value for name, value in (("size", args.burst_size),
             ("spread_s", args.burst_spread)) if value is not None}  # fmt: skip
    if burst or workload == "code-completion":  # code-completion is sent in bursts
        if args.trace_speed is not None or args.rate == math.inf:
            raise ValueError("bursts need a finite --rate, not --trace-speed or inf")
        arrivals = Bursts(DEFAULT_RATE if args.rate is None else args.rate, **burst)
    elif args.rate is not None:
        arrivals = PoissonArrivals(args.rate)
    elif args.trace_speed is not None:
        arrivals = TraceTimes(args.trace_speed)
    output_len = args.output_len
    inputs, outputs = default_lengths(workload)
    shape = SharedPrefixShape(
        groups=args.groups,
        prompts_per_group=args.prompts_per_group,
        system_prompt_len=args.system_prompt_len,
        question_len=args.question_len,
        output_len=output_len if output_len is not None else _SHAPE.output_len,
    )
    if args.target is None:
        raise ValueError("--target is needed to send load")
    return BenchConfig(
        target=args.target,
        workload=workload,
        trace_file=args.trace,
        arrivals=arrivals,
        duration_s=args.duration,
        max_requests=args.max_requests,
        seed=args.seed,
        model=args.model,
        endpoint=args.endpoint,
        stream=args.stream,
        grace_s=args.grace,
        slo=Slo(ttft_ms=args.slo_ttft_ms, itl_ms=args.slo_itl_ms),
        shared_prefix=shape,
        input_len=_lengths(args.input_len, args, inputs),
        output_len=_lengths(output_len, args, outputs),
    )


def _lengths(mean: int | None, args: argparse.Namespace, default: LengthDist) -> LengthDist | None:
    """A length distribution from the flags over the workload's `default`; None (the default)
    when no flag was given."""
    if mean is None and args.length_dist is None and args.range_ratio is None:
        return None
    return LengthDist(
        mean if mean is not None else default.mean,
        args.length_dist or default.kind,
        args.range_ratio if args.range_ratio is not None else default.range_ratio,
    )


async def first_model(client: HttpClient, origin: Origin, api_key: str | None) -> str:
    """The first model in the server's /v1/models."""
    models = await list_models(client, origin, list(_auth(api_key)))
    if not models:
        raise DiscoveryError("the server lists no models")
    return models[0]


def compare(folders: list[Path], console: Console, errors: Console) -> int:
    """Print saved runs side by side; 0, or 2 when a folder holds no run."""
    try:
        runs = [load_run(folder) for folder in folders]
    except SavedRunError as exc:
        errors.print(f"[red]fleetgate bench: {exc}[/]")
        return 2
    console.print(compare_table(runs))
    return 0


async def run(args: argparse.Namespace) -> int:
    """Run `fleetgate bench`; 0 when any request succeeded, 1 when none did, 2 on bad flags
    or a bad trace file. With --compare, print saved runs instead (0, or 2)."""
    console = Console()
    errors = Console(stderr=True)
    if args.compare is not None:
        return compare(args.compare, console, errors)
    try:
        config = config_from_args(args)
        origin = Origin.parse(config.target)
        # The whole file, before any request: a bad row stops the run before it starts.
        trace = None if config.trace_file is None else check_trace(config.trace_file)
    except ValueError as exc:  # TraceError is one
        errors.print(f"[red]fleetgate bench: {exc}[/]")
        return 2
    client = HttpClient()
    try:
        if config.model is None:
            try:
                model = await first_model(client, origin, args.api_key)
            except DiscoveryError as exc:
                errors.print(f"[red]cannot list models at {origin} ({exc}); pass --model[/]")
                return 2
            config = replace(config, model=model)
        assert config.model is not None
        settings = LoadSettings(
            model=config.model,
            duration_s=config.duration_s,
            stream=config.stream,
            grace_s=config.grace_s,
            api_key=args.api_key,
        )
        specs = build_workload(config, random.Random(config.seed))
        bar = None if args.quiet else ProgressBar(config.duration_s, errors)
        generator = LoadGenerator(client, origin, settings, clock=time.perf_counter, observer=bar)
        # Load per backend only goes into the report, so it is read only for one.
        sampler = None
        if args.out is not None:
            sampler = BackendSampler(
                client, origin, clock=time.perf_counter, headers=_auth(args.api_key)
            )
        sampling = sampler.running() if sampler is not None else contextlib.nullcontext()
        with bar or contextlib.nullcontext(), _stop_on_ctrl_c(errors) as stop:
            async with sampling:
                result = await generator.run(specs, stop)
        backends = None if sampler is None else sampler.load()
    finally:
        await client.close()

    summary = summarize(result.records, result.duration_s, config.slo)
    title = f"fleetgate bench: {config.workload} -> {origin}"
    console.print(summary_table(summary, title))
    if config.workload in TRACE_SOURCES:
        console.print(f"trace: {TRACE_SOURCES[config.workload]}")
    if trace is not None:
        console.print(
            f"trace: {config.trace_file} ({trace.format}, {trace.requests} requests "
            f"over {trace.span_s:.1f} s of trace time)"
        )
    if result.max_lag_s > _LAG_WARNING_S:
        errors.print(
            f"[yellow]warning: a send left {result.max_lag_s * 1000:.0f} ms late; "
            "the load generator could not keep the schedule[/]"
        )
    if args.out is not None:
        records = result.records if args.save_requests else None
        doc = config.to_json()
        written = write_results(args.out, summary, doc, records, backends)
        written += write_report(args.out, summary, doc, result.records, title, backends)
        for path in written:
            console.print(f"wrote {path}")
        _say_why_no_backends(backends, console)
    return 0 if summary.completed > 0 else 1


def _auth(api_key: str | None) -> tuple[tuple[bytes, bytes], ...]:
    return ((b"authorization", b"Bearer " + api_key.encode()),) if api_key else ()


def _say_why_no_backends(backends: BackendLoad | None, console: Console) -> None:
    if backends is not None and not backends.backends:
        console.print(f"no backends.png: {NEEDS_GATEWAY} ({backends.unavailable})")


@contextlib.contextmanager
def _stop_on_ctrl_c(console: Console) -> Iterator[asyncio.Event]:
    """An event that the first Ctrl-C sets (stop sending, finish the run); a second one quits."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def interrupted() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)  # the next Ctrl-C raises KeyboardInterrupt
        console.print("[yellow]stopping: waiting for requests in flight (Ctrl-C again to quit)[/]")

    try:
        loop.add_signal_handler(signal.SIGINT, interrupted)
    except (NotImplementedError, RuntimeError, ValueError):  # no signals here (not main thread)
        yield stop
        return
    try:
        yield stop
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def main(args: argparse.Namespace) -> int:
    """`run` on a fresh event loop, for a synchronous caller."""
    return asyncio.run(run(args))
