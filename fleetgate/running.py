"""A gateway process: its config's embedded sims started, its shared resources opened, the
gateway composed (fleetgate/serve.py) and listening; its config reloaded (fleetgate/
reload.py) on SIGHUP, a change of its file or the admin API; and everything stopped cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import secrets
import signal
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgspec

from fleetgate.batches.runner import BatchRunner
from fleetgate.batches.sharing import SharedBatches
from fleetgate.batches.store import BatchStore
from fleetgate.clock import Clock, LoopClock
from fleetgate.config import (
    BackendConfig,
    Config,
    ConfigError,
    LimitsConfig,
    PoolConfig,
    check_config,
)
from fleetgate.discovery.file_source import stamp
from fleetgate.discovery.found import Source
from fleetgate.discovery.sources import SourceUnavailable, build_sources
from fleetgate.fleet.backend import Backend, backend_id, backend_origin
from fleetgate.fleet.discovery import DiscoveryError, list_models
from fleetgate.fleet.periodic import PeriodicTasks
from fleetgate.fleet.pool import Pool
from fleetgate.fleet.scraper import MetricsScraper
from fleetgate.gateway.app import Gateway, RequestIds
from fleetgate.health.active import ActiveChecker
from fleetgate.http.client import HttpClient
from fleetgate.http.server import HttpServer, start_server
from fleetgate.http.tls import TlsFiles
from fleetgate.lifecycle.downstream import Downstream
from fleetgate.observe.request_log import RequestLog, open_request_log
from fleetgate.observe.tracing import Tracing, start_tracing
from fleetgate.reload import (
    ConfigSource,
    Kept,
    check_posted,
    check_reloadable,
)
from fleetgate.routing.registry import (
    DEFAULT_POLICY,
    PluginRegistry,
    default_registry,
)
from fleetgate.runtime import settle_heap
from fleetgate.serve import Built, ResolvedPool, check_routing, compose
from fleetgate.shared.state import RoutingState
from fleetgate.traffic.door import Caller
from fleetgate.traffic.instances import InstanceCount
from fleetgate.traffic.redis_store import RedisStore, redis_client
from fleetgate.traffic.store import MemoryStore
from fleetgate.workers.sim.fleet_process import SimFleetProcess
from fleetgate.workers.sim.spec import KvEventsSpec, SimSpec

if TYPE_CHECKING:  # loaded only when a backend publishes KV-cache events (ZMQ: ~30 ms)
    from fleetgate.kv_events.feeds import KvEventFeeds

log = logging.getLogger("fleetgate.running")


async def config_from_backends(
    client: HttpClient, urls: list[str], policy: str, base: Config
) -> Config:
    """Pools made by asking each backend which models it serves (like `--worker-urls`)."""
    by_model: dict[str, list[BackendConfig]] = {}
    for url in urls:
        try:
            models = await list_models(client, backend_origin(url))
        except (DiscoveryError, ValueError) as exc:
            raise ConfigError(f"--backend {url}: {exc}") from None
        for model in models:
            by_model.setdefault(model, []).append(BackendConfig(url=url))
    if not by_model:
        raise ConfigError("none of the --backend servers lists a model at GET /v1/models")
    pools = [PoolConfig(model=m, policy=policy, backends=b) for m, b in sorted(by_model.items())]
    return msgspec.structs.replace(base, pools=pools)


def start_sims(config: Config, rng: random.Random) -> tuple[SimFleetProcess | None, Config]:
    """The embedded sim workers `config` asks for (`sim:` backends), started (it blocks until
    they listen), and `config` with each of those backends given its worker's URL."""
    specs = [
        SimSpec(
            model=p.model,
            profile=b.sim,
            seed=rng.getrandbits(32),
            scheduling_policy="priority" if p.engine_priority else "fcfs",
            kv_events=None
            if b.kv_events is None
            else KvEventsSpec(
                encoding="array" if b.kv_events.encoding == "array" else "map",
                topic=b.kv_events.topic,
            ),
        )
        for p in config.pools
        for b in p.every_backend()
        if b.sim is not None
    ]
    if not specs:
        return None, config
    sims = SimFleetProcess(specs, host="127.0.0.1")
    sims.start()
    return sims, with_sims(config, sims.places)


SimPlace = tuple[str, tuple[str, str] | None]  # a started sim's URL and KV-event endpoints


def with_sims(config: Config, places: Sequence[SimPlace]) -> Config:
    """`config` with each `sim:` backend, in order, given its started worker's `places`."""
    left = iter(places)

    def located(backends: list[BackendConfig]) -> list[BackendConfig]:
        return [b if b.sim is None else _located(b, *next(left)) for b in backends]

    pools = []
    for p in config.pools:
        pool = msgspec.structs.replace(p, backends=located(p.backends))
        if p.prefill is not None:
            prefill = msgspec.structs.replace(p.prefill, backends=located(p.prefill.backends))
            pool = msgspec.structs.replace(pool, prefill=prefill)
        pools.append(pool)
    return msgspec.structs.replace(config, pools=pools)


def _located(b: BackendConfig, url: str, publisher: tuple[str, str] | None) -> BackendConfig:
    """A sim backend, given its worker's URL and KV-event endpoints."""
    events = b.kv_events
    if events is not None and publisher is not None:
        endpoint, replay = publisher
        events = msgspec.structs.replace(events, endpoint=endpoint, replay_endpoint=replay)
    return msgspec.structs.replace(b, url=url, sim=None, kv_events=events)


def build_limit_store(
    limits: LimitsConfig, clock: Clock, rng: random.Random
) -> MemoryStore | RedisStore:
    """Where limits are counted (`limits.store`): this process's memory, or a Redis that every
    gateway on it shares; a RedisStore counts the gateways from `start()` until `close()`."""
    if limits.store != "redis":
        return MemoryStore(clock.now)
    assert limits.redis_url is not None  # LimitsConfig checks it
    client = redis_client(limits.redis_url)
    # Not drawn from `rng`: gateways started from one config (one seed) need distinct ids.
    instance_id = secrets.token_hex(8)
    instances = InstanceCount(
        client, limits.key_prefix, instance_id, random.Random(rng.getrandbits(64)), clock
    )
    return RedisStore(client, instances, clock.now)


class Background(Protocol):
    """Work a gateway runs beside its requests until it stops (the batches)."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


class RunningGateway:
    """A started gateway: where it listens, how to reload its config and how to stop it."""

    def __init__(
        self, server: HttpServer, client: HttpClient, sims: SimFleetProcess | None,
        gateway: Gateway, config: Config, checker: ActiveChecker,
        scraper: MetricsScraper, background: PeriodicTasks, tls: bool = False,
        limit_store: RedisStore | None = None, tracing: Tracing | None = None,
        state: RoutingState | None = None, kv_events: KvEventFeeds | None = None,
        sources: Sequence[Source] = (), rebuild: Rebuild | None = None,
        source: ConfigSource | None = None,
    ) -> None:  # fmt: skip
        self._source = source  # where its config is read again from (None: not reloadable)
        self.server = server
        self._sources = sources  # of backends found while running: closed last
        self._state = state  # synced with the other gateways until closed
        self._kv_events = kv_events  # subscribed to the engines until closed
        self.tls = tls
        self._limit_store = limit_store  # shared through Redis: its heartbeat and client
        self._tracing = tracing
        # The batches' runner (set once started), stopped first: a request it has in flight
        # runs again later.
        self.batches: Background | None = None
        self._checker = checker
        self._scraper = scraper
        self._background = background  # the TLS files' reload checks, GPU readings' expiry
        self.gateway = gateway
        self.config = config  # in use, as it was given (its sims without URLs)
        self._rebuild = rebuild  # a reloaded config's gateway (None: not reloadable)
        self._client = client
        self._sims = sims
        self._reloading = asyncio.Lock()  # one reload at a time
        self._stopping = False  # draining or closed: a reload is refused

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def pools(self) -> dict[str, Pool]:
        return {model: cluster.pool for model, cluster in self.gateway.clusters.items()}

    async def _wind_down(self) -> None:
        """Stop what runs beside the requests: no reload, batch, probe or scrape from now on."""
        self._stopping = True
        if self.batches is not None:
            await self.batches.stop()
        self._checker.stop()
        self._scraper.stop()
        self._background.stop()
        self.gateway.end_streams()

    async def reload(self, read: Callable[[], Awaitable[Config]], via: str) -> None:
        """Serve the config `read` gives from the next request on (fleetgate/reload.py); `via`
        says who asked (signal, file, admin), for the metrics and the log. ConfigError: it
        was refused, and the config in use is kept."""
        assert self._rebuild is not None  # start_gateway gives one
        async with self._reloading:
            if self._stopping:
                raise ConfigError("the gateway is stopping: it takes no new config")
            kept = self._rebuild.kept
            try:
                config = await read()
                check_reloadable(self.config, config)
                gateway = self._rebuild.gateway(config)
            except Exception as exc:
                error = exc if isinstance(exc, ConfigError) else ConfigError(repr(exc))
                kept.reloads.record(via, False, time.time())
                log.error("config reload (%s) refused, the config in use kept: %s", via, error)
                raise error from None
            old, self.gateway, self.config = self.gateway, gateway, config
            self.server.serve_with(gateway.handle, gateway.send_error)
            old.end_streams()  # a dashboard's event stream: its page connects again, here
            kept.reloads.record(via, True, time.time())
            log.warning("config reloaded (%s)", via)

    async def reload_file(self, via: str) -> None:
        """The config file read again (SIGHUP, or it changed); ConfigError: refused. Without
        a file (the built-in fleet, --backend, --workers) there is nothing to read: a line
        says so."""
        if self._source is None or self._source.path is None:
            log.warning("config reload (%s) skipped: not started from one --config file", via)
            return
        await self.reload(self._source.read, via)

    def watch_config(self, every_s: float) -> None:
        """Reload the config file when it changes (looked at every `every_s`, as a file of
        backends is: discovery/file_source.py), until the gateway stops."""
        path = None if self._source is None else self._source.path
        if path is None:
            return  # no file: nothing to watch

        def looked() -> tuple[int, int, int] | None:
            with contextlib.suppress(OSError):  # tried again at the next look
                return stamp(path)
            return None

        seen = looked()

        async def check() -> None:
            nonlocal seen
            now = looked()
            if now is not None and now != seen:
                seen = now
                await _reload_quietly(self, "file")

        self._background.every(every_s, 0.0, check, wait_first=True)

    async def reload_posted(self, text: bytes) -> None:
        """A config sent to POST /admin/config; ConfigError: refused."""
        source = self._source
        if source is None:
            raise ConfigError("the gateway was not started from a config file (--config)")

        async def read() -> Config:
            config = await source.parse(text)
            check_posted(self.config, config)
            return config

        await self.reload(read, "admin")

    async def drain(self, timeout_s: float) -> int:
        """Finish the requests in progress (up to `timeout_s`), then stop everything."""
        await self._wind_down()
        left = await self.server.drain(timeout_s)
        await self.close()
        return left

    async def close(self) -> None:
        await self._wind_down()
        await self.server.close()
        if self._rebuild is not None:
            self._rebuild.kept.scalers.drop_all()  # the workers they started stop
        logs = [] if self._rebuild is None else self._rebuild.kept.request_logs
        for request_log in logs:
            request_log.flush()  # the last requests' lines
        if self._tracing is not None:
            await self._tracing.close()  # the last spans exported
        await self._client.close()
        if self._limit_store is not None:
            await self._limit_store.close()
        if self._state is not None:
            await self._state.close()
        if self._kv_events is not None:
            await self._kv_events.close()
        for source in self._sources:
            await source.close()
        if self._sims is not None:
            self._sims.stop()


@dataclass(slots=True)
class Rebuild:
    """How a reload builds a config's gateway: `compose` with the running process's parts."""

    kept: Kept
    compose: Callable[[Config, list[ResolvedPool], Kept], Built]
    registry: PluginRegistry
    sims: SimFleetProcess | None = None

    def gateway(self, config: Config) -> Gateway:
        """The gateway of `config` (checked as at start: ConfigError, and nothing running is
        changed) over the kept pools; the last config's background tasks are stopped once it
        is built."""
        check_config(config)
        if self.sims is not None:
            config = with_sims(config, self.sims.places)
        check_routing(config, self.registry)
        kept = self.kept
        last, kept.tasks = kept.tasks, []
        try:
            gateway, _ = self.compose(config, resolve(config), kept)
        except BaseException:
            kept.stop_tasks()
            kept.tasks = last
            raise
        for stop in last:
            stop()
        return gateway


def _request_log(config: Config, clock: Clock, kept: Kept) -> RequestLog | None:
    """The request log `request_log` asks for (None: off), the one open when it is the same."""
    settings = config.request_log
    if not settings.enabled:
        return None
    if kept.request_log is not None and kept.request_log[0] == settings:
        return kept.request_log[1]
    try:
        opened = open_request_log(settings, clock.call_later)
    except OSError as exc:
        raise ConfigError(f"request_log.path: cannot append to it: {exc.strerror}") from None
    kept.request_log = (settings, opened)
    kept.request_logs.append(opened)
    return opened


def resolve(config: Config) -> list[ResolvedPool]:
    """Each pool of `config` (every backend with its URL: sims started) with its backends."""
    resolved: list[ResolvedPool] = []
    for pool in config.pools:
        backends = []
        n = len(pool.backends)
        for i, b in enumerate(pool.every_backend()):
            url = b.url
            assert url is not None  # a sim's is its worker's now
            name = f"{pool.model}#{i}" if i < n else f"{pool.model}#prefill{i - n}"
            backends.append(
                Backend(
                    id=backend_id(url),
                    url=url,
                    models=(pool.model,),
                    weight=b.weight,
                    labels=dict(b.labels),
                    max_in_flight=b.max_in_flight,
                    api_key=b.api_key,
                    name=name,
                    cost_per_hour_usd=b.cost_per_hour_usd,
                    engine=b.engine,
                )
            )
        resolved.append(ResolvedPool(pool, tuple(backends[:n]), tuple(backends[n:])))
    return resolved


async def start_gateway(
    config: Config,
    *,
    clock: Clock | None = None,
    registry: PluginRegistry | None = None,
    reuse_port: bool = False,
    source: ConfigSource | None = None,
) -> RunningGateway:
    """Start embedded sims (if any), build pools and metrics, and listen; every timer runs
    on `clock` (the running loop's by default). `reuse_port`: other processes listen on the
    same port (`serve --workers`). `source`: where `config` came from, read again on a
    reload (None: its config is never reloaded; POST /admin/config is refused)."""
    check_config(config)
    given = config  # what a reloaded config is compared with (fleetgate/reload.py)
    clock = clock or LoopClock()
    registry = registry or default_registry()
    kept = Kept(RequestIds())
    kept.reloads.last_success_at = time.time()  # the config in use, taken now
    _request_log(config, clock, kept)  # before anything starts: an unwritable path stops here
    rng = random.Random(config.seed)
    tracing = None
    if config.tracing.enabled:
        sampling = random.Random(rng.getrandbits(64))
        tracing = start_tracing(config.tracing, time.time() - clock.now(), sampling)
    client = HttpClient(connect_timeout_s=config.server.connect_timeout_s, clock=clock)
    sims, config = await asyncio.get_running_loop().run_in_executor(None, start_sims, config, rng)
    checker = ActiveChecker(client, clock, random.Random(rng.getrandbits(64)))
    scraper = MetricsScraper(client, clock, random.Random(rng.getrandbits(64)))
    background = PeriodicTasks(random.Random(rng.getrandbits(64)), clock)
    store = build_limit_store(config.limits, clock, rng)
    shared = store if isinstance(store, RedisStore) else None
    state = RoutingState(config.state, clock, random.Random(rng.getrandbits(64)))
    kv_events = _kv_event_feeds(config)
    try:
        sources = build_sources(config.discovery, clock.now)
    except SourceUnavailable as exc:
        raise ConfigError(f"$.discovery: {exc}") from None
    batches: Background | None = None
    try:
        if shared is not None:
            shared.start()
        batch_store = open_batch_store(config)
        build = functools.partial(
            compose, transport=client, clock=clock, rng=rng, registry=registry,
            checker=checker, scraper=scraper, limit_store=store, tracing=tracing,
            batch_store=batch_store, background=background, state=state, kv_events=kv_events,
            sources=sources,
        )  # fmt: skip

        def rebuilt(config: Config, resolved: list[ResolvedPool], kept: Kept) -> Built:
            request_log = _request_log(config, clock, kept)
            return build(config, resolved, kept=kept, request_log=request_log)

        gateway, _ = rebuilt(config, resolve(config), kept)
        state.start()
        if kv_events is not None:
            kv_events.start()
        s = config.server
        tls = None
        if s.tls_cert_file is not None and s.tls_key_file is not None:
            try:
                tls = TlsFiles(s.tls_cert_file, s.tls_key_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"server.tls_cert_file / tls_key_file: {exc}") from None

            async def reload(files: TlsFiles = tls) -> None:
                files.reload_if_changed()

            background.every(s.tls_reload_s, 0.0, reload, wait_first=True)
        server = await start_server(
            gateway.handle, gateway.send_error, s.host, s.port, s,
            tls.context if tls is not None else None, clock=clock, reuse_port=reuse_port,
        )  # fmt: skip
        running = RunningGateway(
            server=server, client=client, sims=sims, gateway=gateway, config=given,
            checker=checker, scraper=scraper, background=background, tls=tls is not None,
            limit_store=shared, tracing=tracing, state=state, kv_events=kv_events,
            sources=sources, rebuild=Rebuild(kept, rebuilt, registry, sims), source=source,
        )  # fmt: skip
        kept.reload_posted = running.reload_posted
        book = gateway.batch_book
        if book is not None:

            async def serve_as(caller: Caller, path: bytes, body: bytes, out: Downstream) -> None:
                # as the config in use now serves it
                await running.gateway.inference.serve_as(caller, path, body, out)

            batch_rng = random.Random(rng.getrandbits(64))
            runner = BatchRunner(book, serve_as, config.batches.concurrency, batch_rng, clock)
            batches = runner
            if book.shared and batch_store is not None:
                directory = batch_store.directory_id
                lease = state.lease("batches", directory, config.batches.lease_s)
                batches = SharedBatches(book, runner, lease, clock)
            batches.start()
            running.batches = batches
    except BaseException:
        checker.stop()
        scraper.stop()
        background.stop()
        await client.close()
        if shared is not None:
            await shared.close()
        await state.close()
        if kv_events is not None:
            await kv_events.close()
        for found_in in sources:
            await found_in.close()
        if sims is not None:
            sims.stop()
        if tracing is not None:
            await tracing.close()
        raise
    return running


def _kv_event_feeds(config: Config) -> KvEventFeeds | None:
    """A feed for each decode backend whose engine publishes KV-cache events (every URL is
    known by now: sims started); None when none does (ZMQ is then never loaded)."""
    if not any(b.kv_events is not None for pool in config.pools for b in pool.backends):
        return None
    from fleetgate.kv_events.feeds import KvEventFeeds

    feeds = KvEventFeeds(time.time)
    for pool in config.pools:
        for b in pool.backends:
            if b.kv_events is not None and b.url is not None:
                feeds.follow(pool.model, backend_id(b.url), b.kv_events)
    return feeds


def open_batch_store(config: Config) -> BatchStore | None:
    """The Batch API's store, its objects read (None when `batches.enabled` is off). Its ids
    are drawn from the system's randomness, never the config's seed: a restarted gateway must
    not draw the ids it drew before."""
    if not config.batches.enabled:
        return None
    batch_store = BatchStore(config.batches.directory(), random.Random(secrets.randbits(128)))
    batch_store.load()
    return batch_store


def banner(running: RunningGateway, host: str) -> str:
    base = f"{'https' if running.tls else 'http'}://{host}:{running.port}"
    models = sorted(running.pools)
    lines = [f"fleetgate listening on {base}", "models:"]
    for model in models:
        pool = running.pools[model]
        ids = ", ".join(s.backend.id for s in pool.states)
        lines.append(f"  {model}  ({len(pool.states)} backends: {ids})")
    m = models[0]
    if running.gateway.auth:
        lines.append("auth: on (API keys required)")
    else:
        lines.append("auth: OFF - anyone who can reach this port may use every model")
    lines += [
        "",
        "try it:",
        f"  curl {base}/v1/chat/completions -H 'content-type: application/json' \\",
        f'    -d \'{{"model": "{m}", "messages": [{{"role": "user", "content": '
        f'"Hello!"}}], "max_tokens": 32}}\'',
        "",
        "  from openai import OpenAI",
        f"  client = OpenAI(base_url='{base}/v1', api_key='unused')",
        f"  print(client.chat.completions.create(model='{m}',",
        "        messages=[{'role': 'user', 'content': 'Hello!'}]).choices[0].message.content)",
        "",
        f"metrics: {base}/metrics    stop: Ctrl-C",
    ]
    if running.gateway.has_dashboard:
        lines.insert(-1, f"dashboard: {base}/dashboard    in a terminal: fleetgate top")
    return "\n".join(lines)


async def resolve_pools(config: Config, backend_urls: list[str], policy: str | None) -> Config:
    """`config` with pools asked of `backend_urls` when given (`serve --backend`), and every
    pool on `policy` when given (`serve --policy`)."""
    if backend_urls:
        probe = HttpClient(connect_timeout_s=config.server.connect_timeout_s)
        try:
            config = await config_from_backends(
                probe, backend_urls, policy or DEFAULT_POLICY, config
            )
        finally:
            await probe.close()
    elif policy is not None:
        config = msgspec.structs.replace(
            config,
            pools=[
                msgspec.structs.replace(p, policy=policy, policy_params={}, routing=None)
                for p in config.pools
            ],
        )
    return config


async def serve_forever(
    config: Config, worker: int | None = None, source: ConfigSource | None = None
) -> None:
    """Run until SIGINT or SIGTERM, then stop everything that was started; SIGHUP reloads the
    config from `source` (and, with `server.watch_config_s`, so does a change of its file).
    `worker`: this process is that one of several on the port (fleetgate/processes.py); the
    first prints the banner."""
    loop = asyncio.get_running_loop()
    # A SIGHUP while starting would end the process (its default action): it is logged.
    loop.add_signal_handler(signal.SIGHUP, log.warning, "SIGHUP while starting: ignored")
    running = await start_gateway(config, reuse_port=worker is not None, source=source)
    settle_heap()
    signals = asyncio.Queue[int]()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    reloads: set[asyncio.Task[None]] = set()

    def reload(via: str) -> None:
        task = loop.create_task(_reload_quietly(running, via))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload, "signal")
    if config.server.watch_config_s > 0:
        running.watch_config(config.server.watch_config_s)
    if worker:
        print(f"fleetgate: worker {worker} listening on port {running.port} too", flush=True)
    else:
        print(banner(running, config.server.host), flush=True)
    await signals.get()
    loop.remove_signal_handler(signal.SIGHUP)
    for task in reloads:  # a reload not applied yet is dropped: the gateway stops
        task.cancel()
    timeout_s = running.config.server.drain_timeout_s
    print(
        f"fleetgate: draining (up to {timeout_s:g} s; signal again to stop now)",
        file=sys.stderr, flush=True,
    )  # fmt: skip
    drain = loop.create_task(running.drain(timeout_s))
    second = loop.create_task(signals.get())
    await asyncio.wait((drain, second), return_when=asyncio.FIRST_COMPLETED)
    if not drain.done():
        drain.cancel()
        await running.close()
    second.cancel()
    print("fleetgate: stopped", file=sys.stderr, flush=True)


async def _reload_quietly(running: RunningGateway, via: str) -> None:
    """Reload from the file; a refusal was logged and counted already (`reload`)."""
    with contextlib.suppress(ConfigError):
        await running.reload_file(via)
