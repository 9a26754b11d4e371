"""The composition root: builds the whole gateway from its config, starts it, stops it cleanly.

Everything with state (pools, policies, the HTTP client, metrics, the clock and random source)
is made here and passed in; nothing is found through globals.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import random
import secrets
import signal
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec

from fleetgate.batches.book import BatchBook
from fleetgate.batches.files import FileShelf
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
from fleetgate.director.cache import ResponseCache
from fleetgate.director.director import Director
from fleetgate.discovery.found import Source
from fleetgate.discovery.reconcile import Discovery
from fleetgate.discovery.sources import SourceUnavailable, build_sources
from fleetgate.fleet.backend import Backend, BackendState, backend_id, backend_origin
from fleetgate.fleet.discovery import DiscoveryError, list_models
from fleetgate.fleet.load_board import LoadBoard, MemoryLoadBoard
from fleetgate.fleet.membership import Membership
from fleetgate.fleet.periodic import PeriodicTasks
from fleetgate.fleet.pool import Pool
from fleetgate.fleet.scraper import MetricsScraper
from fleetgate.gateway.admin import Admin
from fleetgate.gateway.app import Gateway, RequestIds
from fleetgate.gateway.batch_api import BatchApi
from fleetgate.gateway.dashboard import Dashboard
from fleetgate.gateway.heartbeat import HeartbeatEndpoint
from fleetgate.gateway.inference import InferenceEndpoints
from fleetgate.health.active import ActiveChecker
from fleetgate.health.gpu import GpuBoard, GpuWatch
from fleetgate.health.outlier import OutlierDetector
from fleetgate.health.probes import BackendProbes
from fleetgate.http.client import HttpClient
from fleetgate.http.forwarding import RequestHeaders
from fleetgate.http.server import HttpServer, start_server
from fleetgate.http.tls import TlsFiles
from fleetgate.http.transport import Transport
from fleetgate.lifecycle.accounting import FleetAccounting
from fleetgate.lifecycle.downstream import Downstream
from fleetgate.lifecycle.hooks import Emitters, Hooks
from fleetgate.observe.audit import AuditLog
from fleetgate.observe.live import LiveView
from fleetgate.observe.metrics import GatewayMetrics
from fleetgate.observe.picks import LastPicks
from fleetgate.observe.request_log import RequestLog, open_request_log
from fleetgate.observe.slo import SloBook
from fleetgate.observe.tracing import Tracing, start_tracing
from fleetgate.observe.usage import TenantUsage
from fleetgate.reload import (
    ConfigSource,
    Kept,
    PoolAdmission,
    carry_pools,
    check_posted,
    check_reloadable,
)
from fleetgate.resilience.cluster import Cluster
from fleetgate.resilience.continuation import Continuation
from fleetgate.resilience.failover import Failover
from fleetgate.resilience.hedge import TtftWindow
from fleetgate.resilience.retry import RetryBudget
from fleetgate.routing.models import Alias, LengthKeywords, ModelRoute, Split, Tiers
from fleetgate.routing.pipeline import RoutingPipeline
from fleetgate.routing.registry import (
    DEFAULT_POLICY,
    PluginContext,
    PluginRegistry,
    default_registry,
)
from fleetgate.routing.router import Router
from fleetgate.routing.stores import EngineBlocks
from fleetgate.runtime import settle_heap
from fleetgate.shared.state import RoutingState, StateSettings
from fleetgate.traffic.admission import Admission
from fleetgate.traffic.batch_lane import BatchLane
from fleetgate.traffic.concurrency import ConcurrencyLimit
from fleetgate.traffic.door import Caller, FrontDoor
from fleetgate.traffic.instances import InstanceCount
from fleetgate.traffic.keys import ADMIN, HEARTBEAT, KeyRing, digest_of, read_key_file
from fleetgate.traffic.limits import Limits
from fleetgate.traffic.redis_store import RedisStore, redis_client
from fleetgate.traffic.store import LimitStore, MemoryStore
from fleetgate.traffic.tenants import ANONYMOUS, Tenant
from fleetgate.upstream.attempt import Attempts
from fleetgate.upstream.prefill import Prefill
from fleetgate.workers.sim.fleet_process import SimFleetProcess
from fleetgate.workers.sim.spec import KvEventsSpec, SimSpec

if TYPE_CHECKING:  # loaded only when a backend publishes KV-cache events (ZMQ: ~30 ms)
    from fleetgate.kv_events.feeds import KvEventFeeds

DISCOVERY_JITTER = 0.1  # each source read at its interval +- 10%
log = logging.getLogger("fleetgate.serve")


@dataclass(frozen=True, slots=True)
class ResolvedPool:
    """A pool whose backends all have URLs (embedded sims started, discovery done)."""

    config: PoolConfig
    backends: tuple[Backend, ...]
    prefill: tuple[Backend, ...] = ()  # prefill backends of a disaggregated pool


Built = tuple[Gateway, dict[str, Cluster]]  # a config's edge, and its pools' clusters


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


def _pipeline(
    config: PoolConfig, registry: PluginRegistry, ctx: PluginContext, prefill: bool
) -> RoutingPipeline:
    try:
        if prefill:
            assert config.prefill is not None
            return registry.build_pipeline(config.prefill.policy, {}, ctx)
        if config.routing is not None:
            return registry.build_profile(config.routing.profile("routing"), ctx)
        return registry.build_pipeline(config.policy, config.policy_params, ctx)
    except ValueError as exc:
        part = " prefill" if prefill else ""
        raise ConfigError(f"pool {config.model!r}{part}: {exc}") from None


def _routed(
    pool: Pool,
    pipeline: RoutingPipeline,
    outliers: OutlierDetector,
    subscribe: Callable[[Hooks], None],
    watch: Callable[[Hooks, Pool], None] | None,
) -> tuple[Router, Emitters]:
    """`pool` routed by `pipeline`, and the emitters of its events: its own fleet accounting
    and `outliers` (its detector) hear them, what `watch` adds for this pool (a decode pool's
    hedge window and concurrency limit), and what `subscribe` adds."""
    hooks = Hooks()
    FleetAccounting(pool).subscribe(hooks)
    outliers.subscribe(hooks)
    if watch is not None:
        watch(hooks, pool)
    subscribe(hooks)
    emit = Emitters(hooks)
    outliers.on_ejected = emit.ejected
    return Router(pool, pipeline), emit


def _pool(
    name: str,
    config: PoolConfig,
    backends: tuple[Backend, ...],
    board: LoadBoard,
    kept: Kept,
) -> Pool:
    """The pool called `name` (a prefill pool: "model:prefill"): the one kept from the last
    config (its members made to follow this one already: fleetgate/reload.py), else new."""
    pool = kept.pools.get(name)
    if pool is None:
        states = [BackendState(b) for b in backends]
        pool = kept.pools[name] = Pool(
            config.model, states, config.health(), config.weights, board=board
        )
        kept.configured[name] = {b.id for b in backends}
    return pool


def _admission(
    c: PoolConfig, pool: Pool, tenants: Mapping[str, Tenant], clock: Clock, kept: Kept
) -> PoolAdmission | None:
    """The pool's admission (None: off): the one kept while made from the same settings and
    tenants' caps and floors (its queue and learned limit go on), else new."""
    admit = c.admission
    if not admit.enabled:
        return None
    settings = [t.settings for t in tenants.values()]
    caps = {(s.name, s.max_concurrency, s.min_concurrency) for s in settings}

    def make() -> PoolAdmission:
        now = clock.now
        limit = ConcurrencyLimit(admit.limit, pool, now, c.engine_priority)
        lane = BatchLane(admit.batch_lane, len(pool.states), now())
        admission = Admission(admit, limit, tenants, clock, lane, c.engine_priority)
        return PoolAdmission(admission, limit, lane)

    return kept.admissions.get(c.model, (admit, c.engine_priority, caps), make)


def _routing(
    name: str,
    c: PoolConfig,
    registry: PluginRegistry,
    make_context: Callable[[], PluginContext],
    kept: Kept,
) -> tuple[PluginContext, RoutingPipeline]:
    """The routing of the pool called `name` (prefill: "model:prefill"): its stores, kept for
    good, and its pipeline, kept while its settings are the same (ConfigError: it cannot be
    built)."""
    ctx = kept.contexts.get(name)
    if ctx is None:
        ctx = kept.contexts[name] = make_context()
    prefill = name != c.model
    made_from = (c.prefill.policy, ) if prefill and c.prefill is not None else (
        c.policy, c.policy_params, c.routing, c.engine_metrics.stale_after_s)  # fmt: skip
    pipeline = kept.pipelines.get(name, made_from, lambda: _pipeline(c, registry, ctx, prefill))
    return ctx, pipeline


def build_clusters(
    resolved: list[ResolvedPool],
    registry: PluginRegistry,
    rng: random.Random,
    *,
    transport: Transport,
    clock: Clock,
    subscribe: Callable[[Hooks], None],
    tenants: Mapping[str, Tenant] | None = None,
    state: RoutingState | None = None,
    kv_events: KvEventFeeds | None = None,
    kept: Kept | None = None,
) -> dict[str, Cluster]:
    """Each pool with its routing, policies, admission queue and event subscribers
    (`subscribe` adds those every pool shares, such as metrics); each pool's routing state
    from `state` (shared/state.py), in this process's memory when none is given, and what its
    engines report holding from `kv_events` (kv_events/feeds.py). With `kept` (a running
    gateway's), what it holds is used and what is made is left there; on a reload, its pools'
    members follow `resolved` (fleetgate/reload.py) once every pipeline was built (so a
    ConfigError leaves them as they were)."""
    now = clock.now
    state = state or RoutingState(StateSettings(), clock, rng)
    kept = kept or Kept(RequestIds())  # a benchmark's or a test's: nothing is kept
    made = []
    for item in resolved:  # the pipelines first (and the rng drawn in the same order)
        c = item.config

        def context(c: PoolConfig = c) -> PluginContext:
            # One of each store per pool (fleet/load_board.py, routing/stores.py).
            return PluginContext(
                random.Random(rng.getrandbits(64)), state.load_board(c.model),
                c.engine_metrics.stale_after_s, prefix_index=state.prefix_index(c.model),
                sessions=state.sessions(c.model),
                engine_blocks=_engine_blocks(c.model, kv_events, state),
            )  # fmt: skip

        ctx, pipeline = _routing(c.model, c, registry, context, kept)
        prefill_routing = None
        if c.prefill is not None:
            name = f"{c.model}:prefill"  # its pool's own stores

            def prefill_context(ctx: PluginContext = ctx, name: str = name) -> PluginContext:
                return replace(
                    ctx, board=state.load_board(name), prefix_index=state.prefix_index(name),
                    sessions=state.sessions(name), engine_blocks=None,
                )  # fmt: skip

            prefill_routing = _routing(name, c, registry, prefill_context, kept)
        made.append((item, ctx, pipeline, prefill_routing))
    if kept.members is not None:
        carry_pools(kept, [(i.config, i.backends, i.prefill) for i in resolved], now())
    clusters: dict[str, Cluster] = {}
    for item, ctx, pipeline, prefill_routing in made:
        c = item.config
        timeouts = c.timeouts()
        hedge = c.hedge
        ttft = kept.ttfts.get(c.model, hedge, functools.partial(TtftWindow, hedge))
        admission: PoolAdmission | None = None

        def watch(hooks: Hooks, pool: Pool, c: PoolConfig = c, ttft: TtftWindow = ttft) -> None:
            nonlocal admission
            ttft.subscribe(hooks)
            admission = _admission(c, pool, tenants or {}, clock, kept)
            if admission is not None:
                admission.limit.subscribe(hooks)
                admission.lane.subscribe(hooks)

        pool = _pool(c.model, c, item.backends, ctx.board, kept)
        router, emit = _routed(pool, pipeline, _outliers(c.model, c, pool, kept), subscribe, watch)
        prefill = None
        if prefill_routing is not None:
            name = f"{c.model}:prefill"
            prefill_ctx, prefill_pipeline = prefill_routing
            prefill_pool = _pool(name, c, item.prefill, prefill_ctx.board, kept)
            prefill_router, prefill_emit = _routed(
                prefill_pool, prefill_pipeline, _outliers(name, c, prefill_pool, kept),
                subscribe, None,
            )  # fmt: skip
            prefill = Prefill(transport, now, prefill_router, timeouts, prefill_emit)
        retries = c.retries
        clusters[c.model] = Cluster(
            router=router,
            timeouts=timeouts,
            retries=retries,
            budget=RetryBudget(retries),
            hedge=hedge,
            ttft=ttft,
            emit=emit,
            prefill=prefill,
            admission=None if admission is None else admission.admission,
            engine_priority=c.engine_priority,
        )
    return clusters


def _outliers(name: str, c: PoolConfig, pool: Pool, kept: Kept) -> OutlierDetector:
    """The pool's outlier detector, kept while its settings are (its counts go on)."""
    return kept.outliers.get(name, c.outlier, lambda: OutlierDetector(c.outlier, pool))


def _response_cache(
    config: Config, clock: Clock, state: RoutingState, kept: Kept
) -> ResponseCache | None:
    """The response cache `cache:` asks for (None: off), in memory or shared through Redis;
    the one in use while its settings are the same (its answers stay)."""
    c = config.cache
    if not c.enabled:
        return None
    if kept.cache is not None and kept.cache[0] == c:
        return kept.cache[1]
    shared = state.answers(c.ttl_s, c.coalesce_timeout_s) if c.store == "redis" else None
    cache = ResponseCache(c, clock, shared)
    kept.cache = (c, cache)
    return cache


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
        for b in _all_backends(p)
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


def _all_backends(pool: PoolConfig) -> list[BackendConfig]:
    """A pool's decode (or only) backends, then its prefill backends."""
    return [*pool.backends, *(pool.prefill.backends if pool.prefill is not None else ())]


def _parts(cluster: Cluster) -> tuple[Pool, ...]:
    """A cluster's pool, and its prefill pool when it is disaggregated."""
    if cluster.prefill is None:
        return (cluster.pool,)
    return (cluster.pool, cluster.prefill.router.pool)


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


def build_front_door(
    config: Config,
    tenants: Mapping[str, Tenant],
    clock: Callable[[], float],
    wall_clock: Callable[[], float],
    store: LimitStore | None = None,
) -> tuple[FrontDoor | None, KeyRing[str] | None]:
    """The tenants' door (None when auth is off and no one is limited) and the operator's
    keys (None when auth is off), counting limits in `store` (an in-process MemoryStore when
    none is given: whoever gives a shared one starts and closes it). ConfigError for a bad key
    file."""
    keys: KeyRing[Caller] | None = None
    operators: KeyRing[str] | None = None
    if config.auth_enabled:
        keys, operators = KeyRing(), KeyRing()
        pairs = [(t.name, k) for t in config.tenants for k in t.keys]
        pairs += [(ADMIN, k) for k in config.auth.admin_keys]
        pairs += [(HEARTBEAT, k) for k in config.auth.heartbeat_keys]
        if config.auth.key_file is not None:
            try:
                pairs += read_key_file(config.auth.key_file)
            except ValueError as exc:
                raise ConfigError(f"auth.key_file: {exc}") from None
        for owner, key in pairs:
            try:
                if owner in (ADMIN, HEARTBEAT):
                    operators.add(key, owner[1:])
                elif owner in tenants:
                    keys.add(key, Caller(tenants[owner], digest_of(key).hex()[:16]))
                else:
                    raise ValueError(f"no tenant {owner!r} (tenants: {', '.join(tenants)})")
            except ValueError as exc:
                raise ConfigError(f"a key of {owner}: {exc}") from None
    limits = Limits(
        store if store is not None else MemoryStore(clock), wall_clock, config.limits.key_prefix,
        config.limits.assumed_output_tokens,
    )  # fmt: skip
    if keys is None and not any(t.limited for t in tenants.values()):
        return None, operators
    return FrontDoor(keys, limits), operators


def build_model_routes(config: Config, rng: random.Random) -> dict[str, ModelRoute]:
    """Aliases, splits and tiers (routing/models.py) from the `models:` section."""
    routes: dict[str, ModelRoute] = {}
    for route in config.models:
        if route.alias is not None:
            routes[route.name] = Alias(route.alias)
        elif route.split is not None:
            shares = [(share.model, share.weight) for share in route.split]
            routes[route.name] = Split(shares, random.Random(rng.getrandbits(64)))
        elif route.tiers is not None:
            t = route.tiers
            routes[route.name] = Tiers(
                t.cheap, t.strong, LengthKeywords(t.max_prompt_tokens, t.keywords)
            )
    return routes


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
                kept.reloads.record(via, str(error), time.time())
                log.error("config reload (%s) refused, the config in use kept: %s", via, error)
                raise error from None
            old, self.gateway, self.config = self.gateway, gateway, config
            self.server.serve_with(gateway.handle, gateway.send_error)
            old.end_streams()  # a dashboard's event stream: its page connects again, here
            kept.reloads.record(via, None, time.time())
            log.warning("config reloaded (%s)", via)

    async def reload_file(self, via: str) -> None:
        """The config file read again (SIGHUP, or it changed); ConfigError: refused. Without
        a file (the built-in fleet, --backend, --workers) there is nothing to read: a line
        says so."""
        if self._source is None or self._source.path is None:
            log.warning("config reload (%s) skipped: not started from one --config file", via)
            return
        await self.reload(self._source.read, via)

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
        self._stopping = True  # no reload from now on
        if self.batches is not None:
            await self.batches.stop()
        self._checker.stop()
        self._scraper.stop()
        self._background.stop()
        self.gateway.end_streams()
        left = await self.server.drain(timeout_s)
        await self.close()
        return left

    async def close(self) -> None:
        self._stopping = True
        if self.batches is not None:
            await self.batches.stop()
        self._checker.stop()
        self._scraper.stop()
        self._background.stop()
        self.gateway.end_streams()
        await self.server.close()
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


def compose(
    config: Config,
    resolved: list[ResolvedPool],
    *,
    transport: Transport,
    clock: Clock,
    rng: random.Random,
    registry: PluginRegistry | None = None,
    wall_clock: Callable[[], float] = time.time,
    checker: ActiveChecker | None = None,
    scraper: MetricsScraper | None = None,
    limit_store: LimitStore | None = None,
    request_log: RequestLog | None = None,
    tracing: Tracing | None = None,
    batch_store: BatchStore | None = None,
    background: PeriodicTasks | None = None,
    state: RoutingState | None = None,
    kv_events: KvEventFeeds | None = None,
    sources: Sequence[Source] = (),
    kept: Kept | None = None,
) -> tuple[Gateway, dict[str, Cluster]]:
    """The gateway over `resolved` pools and its clusters, everything wired; the checker and
    scraper, when given, start probing the backends (a benchmark or a simulator gives none),
    and `background` runs the gateway's own periodic work (GPU readings growing stale);
    limits are counted in `limit_store`, in this process's memory when none is given; each
    request is written to `request_log` when one is given, and traced by `tracing`; the
    Batch API keeps its files and batches in `batch_store` (none: the API is off), and the
    batches it left running are resumed (their runner is started with the server:
    `start_gateway`); the pools' routing state is kept in
    `state` (shared with other gateways when it has a Redis), in this process's memory when
    none is given; `kv_events` reads what the engines that publish KV-cache events hold; the
    pools' members follow what the discovery `sources` say, each read on its interval by
    `background`. `kept`: what a running gateway keeps from config to config (fleetgate/
    reload.py): what it holds is used, what is made is left there, and what this config
    runs in `background` is listed there (stopped when the next is in)."""
    now = clock.now  # for what only reads the time
    first = kept is None or kept.members is None  # not a reload
    kept = kept if kept is not None else Kept(RequestIds())
    state = state or RoutingState(StateSettings(), clock, rng)  # this process's own
    pins = kept.pins = kept.pins or state.pins()  # the Responses API's, for good
    tenants = {t.name: Tenant.of(t) for t in config.tenants}
    tenants[ANONYMOUS.name] = ANONYMOUS
    # What a bad config refuses comes first, before anything running is changed: the keys,
    # the audit log, then (build_clusters) the routing pipelines.
    door, operators = build_front_door(config, tenants, now, wall_clock, limit_store)
    audit = _audit_log(config, wall_clock, kept)
    clusters: dict[str, Cluster] = {}
    slo = kept.slo = kept.slo or SloBook({}, now)
    slo.configure({p.model: p.slo for p in config.pools})
    usage = kept.usage = kept.usage or TenantUsage()  # the metrics', dashboard's, admin's
    usage.know(t.name for t in config.tenants)
    gpus = GpuBoard(now)  # the GPU agents' readings, for the pools that take them
    metrics = kept.metrics = kept.metrics or _metrics(kept, slo, usage, state, kv_events, now)
    metrics.know_tenants(
        [(t.name, t.priority.label) for t in tenants.values()
         if not (config.auth_enabled and t is ANONYMOUS)],
        config.auth_enabled,
    )  # fmt: skip
    metrics.gpu_expiries = gpus.expiries
    exporters = [slo.subscribe]
    if config.server.metrics:
        exporters.append(metrics.subscribe)
    if config.server.dashboard or config.server.admin:
        exporters.append(usage.subscribe)
    elif config.server.metrics:
        exporters.append(lambda hooks: usage.subscribe(hooks, requests=False))
    live = None
    if config.server.dashboard:
        if kept.live is None:
            kept.live = LiveView(now, wall_clock, random.Random(rng.getrandbits(64)))
        live = kept.live
        exporters.append(live.subscribe)
    if tracing is not None:
        exporters.append(tracing.subscribe)
    picks = kept.picks = kept.picks or LastPicks()  # each backend's last scores, for the admin
    if config.server.admin:  # hearing Routed makes every pick note its scores: only then
        exporters.append(picks.subscribe)
    if request_log is not None:
        exporters.append(request_log.subscribe)
        if tracing is not None:
            request_log.trace_ids = tracing.trace_id

    def subscribe(hooks: Hooks) -> None:
        for exporter in exporters:
            exporter(hooks)

    clusters.update(
        build_clusters(
            resolved, registry or default_registry(), rng, transport=transport, clock=clock,
            subscribe=subscribe, tenants=tenants, state=state, kv_events=kv_events, kept=kept,
        )
    )  # fmt: skip
    kept.clusters = clusters  # what the metrics read from now on
    if config.server.metrics:
        for model, cluster in clusters.items():
            cluster.router.pipeline.set_timer(metrics.routing_timer(model))
    attempts = Attempts(transport, now, None if tracing is None else tracing.headers_for)
    failover = Failover(
        attempts, Continuation(attempts, now), clock, random.Random(rng.getrandbits(64))
    )
    pools = {model: cluster.pool for model, cluster in clusters.items()}
    heartbeats = None
    probes = kept.probes = kept.probes or BackendProbes(checker, scraper)
    for pool_config in config.pools:
        for part in _parts(clusters[pool_config.model]):
            if not probes.watching(part):  # new; those kept were carried over
                probes.start(part, pool_config.health_check, pool_config.engine_metrics)
            part.left = probes.forget  # decode pools' again by their membership
    if kept.members is None:
        kept.members = Membership(pools, now, probes)
    else:
        kept.members.adopt(pools)
    members = kept.members
    if sources and first:
        try:
            discovery = kept.discovery = Discovery(members, sources)
        except ValueError as exc:
            raise ConfigError(f"$.discovery: {exc}") from None
        if background is not None:
            for source in discovery.sources:
                poll = functools.partial(discovery.poll, source)
                background.every(source.interval_s, DISCOVERY_JITTER, poll, wait_first=False)

    async def reload_posted(text: bytes) -> None:
        if kept.reload_posted is None:  # a gateway not started by start_gateway
            raise ConfigError("this gateway cannot reload its config")
        await kept.reload_posted(text)

    admin = None
    if config.server.admin:
        admin = Admin(
            pools=pools,
            clock=now,
            members=members,
            picks=picks,
            usage=usage,
            config=config,
            audit=audit,
            slo=slo,
            reload=reload_posted,
        )
    for pool_config in config.pools:
        if pool_config.gpu.enabled:
            for part in _parts(clusters[pool_config.model]):
                gpus.watch(GpuWatch(pool_config.gpu, part))
    # Heartbeats are taken for a pool checked by them even before it has a backend (those
    # discovery finds come in waiting for their first).
    beats = any(p.health_check.enabled and p.health_check.kind == "heartbeat" for p in config.pools)
    if (checker is not None and (checker.expects_heartbeats or beats)) or gpus.watching:
        heartbeats = HeartbeatEndpoint(checker, gpus if gpus.watching else None)
    edge = Hooks()
    subscribe(edge)
    if audit is not None:
        audit.subscribe(edge)
    edge_emit = Emitters(edge)
    gpus.on_change = edge_emit.gpu_changed
    if background is not None and gpus.watching:

        async def expire_gpu_readings() -> None:
            gpus.expire()

        stop = background.every(gpus.expire_every_s, 0.0, expire_gpu_readings, wait_first=True)
        kept.tasks.append(stop)
    render = metrics.render if config.server.metrics else None
    batch_api = kept.batch_api
    if batch_api is not None:
        batch_api.use(door, tenants)
    elif batch_store is not None:
        settings = config.batches
        keys = None if door is None else door.callers()
        changes = None
        if state.shared:  # several gateways may share the directory
            changes = state.change_mark("batches", batch_store.directory_id)
        book = BatchBook(batch_store, settings, tenants, wall_clock, keys, changes=changes)
        book.resume()  # shared: once it holds the lease
        batch_api = kept.batch_api = BatchApi(FileShelf(batch_store, settings, wall_clock),
                                              book, door)  # fmt: skip
    routes = build_model_routes(config, rng)
    director = Director(
        clusters=clusters, failover=failover, emit=edge_emit, clock=now, door=door,
        routes=routes, pricing={p.model: p.pricing for p in config.pools},
        assumed_output_tokens=config.limits.assumed_output_tokens, pins=pins,
        cache=_response_cache(config, clock, state, kept),
    )  # fmt: skip
    ids = kept.ids
    inference = InferenceEndpoints(
        director, now, ids.next, door=door,
        forward=RequestHeaders(config.server.deny_request_headers),
        passthrough=config.server.passthrough_paths,
    )  # fmt: skip
    gateway = Gateway(
        inference=inference, clusters=clusters, models=[*clusters, *routes], ids=ids,
        created=int(wall_clock()), metrics=render, door=door, operators=operators, audit=audit,
        admin=admin, heartbeats=heartbeats, batches=batch_api,
        dashboard=None if live is None else Dashboard(clusters, slo, live, usage, clock,
                                                      wall_clock),
    )  # fmt: skip
    return gateway, clusters


def _metrics(
    kept: Kept,
    slo: SloBook,
    usage: TenantUsage,
    state: RoutingState,
    kv_events: KvEventFeeds | None,
    now: Callable[[], float],
) -> GatewayMetrics:
    """The metrics, read from the config in use whatever config they were made with."""

    def parts() -> Iterator[tuple[str, Pool]]:
        return ((m, part) for m, c in kept.clusters.items() for part in _parts(c))

    return GatewayMetrics(
        lambda: ((m, s) for m, part in parts() for s in part.states),
        lambda: ((m, c.admission) for m, c in kept.clusters.items() if c.admission is not None),
        slo.status,
        now,
        lambda: usage.by_pool,
        loads=lambda: ((m, s.backend.id, load) for m, part in parts() for s, load in part.loads()),
        shared=state.status,
        leases=state.leases,
        kv_events=(lambda: ()) if kv_events is None else kv_events.status,
        discovery=lambda: () if kept.discovery is None else kept.discovery.statuses(),
        reloads=lambda: kept.reloads,
    )  # fmt: skip


def _audit_log(config: Config, wall_clock: Callable[[], float], kept: Kept) -> AuditLog | None:
    """The audit log `server.audit_log` names (None: none), the one open when it is the same."""
    path = config.server.audit_log
    if not path:
        return None
    if kept.audit is not None and kept.audit[0] == path:
        return kept.audit[1]
    try:
        audit = AuditLog(path, wall_clock)
    except OSError as exc:
        raise ConfigError(f"server.audit_log: cannot append to it: {exc.strerror}") from None
    kept.audit = (path, audit)
    return audit


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
        for i, b in enumerate(_all_backends(pool)):
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


def check_routing(config: Config, registry: PluginRegistry) -> None:
    """ConfigError when a pool's routing cannot be built (as `build_clusters` would say),
    built on throw-away stores: a reload checks it before changing anything running."""
    for pool in config.pools:
        ctx = PluginContext(random.Random(0), MemoryLoadBoard(), pool.engine_metrics.stale_after_s)
        _pipeline(pool, registry, ctx, False)
        if pool.prefill is not None:
            _pipeline(pool, registry, ctx, True)


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


def _engine_blocks(
    model: str, kv_events: KvEventFeeds | None, state: RoutingState
) -> EngineBlocks | None:
    """What the pool's engines report holding (None: none publishes), with what the other
    gateways sent them, when shared."""
    index = None if kv_events is None else kv_events.index(model)
    return None if index is None else state.engine_blocks(model, index)


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
    watch = None
    if source is not None and source.path is not None and config.server.watch_config_s > 0:
        watch = loop.create_task(_watch_file(source.path, config.server.watch_config_s, reload))
    if worker:
        print(f"fleetgate: worker {worker} listening on port {running.port} too", flush=True)
    else:
        print(banner(running, config.server.host), flush=True)
    await signals.get()
    if watch is not None:
        watch.cancel()
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


async def _watch_file(path: str, every_s: float, reload: Callable[[str], None]) -> None:
    """Reload when the file's content changes (checked every `every_s`: a mounted ConfigMap
    is swapped through a symbolic link, which no change of one inode shows); a file that
    cannot be read is tried again at the next check."""
    seen = _digest(path)
    while True:
        await asyncio.sleep(every_s)
        now = _digest(path)
        if now is not None and now != seen:
            seen = now
            reload("file")


def _digest(path: str) -> bytes | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).digest()
    except OSError:
        return None
