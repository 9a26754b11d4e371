"""The composition root: builds the whole gateway from its config (`compose`), over what a
running process keeps from config to config (fleetgate/reload.py `Kept`); the process that
starts, reloads and stops it is fleetgate/running.py.

Everything with state (pools, policies, the HTTP client, metrics, the clock and random source)
is made here or there and passed in; nothing is found through globals.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fleetgate.autoscale.kubernetes import ActuatorUnavailable, KubernetesActuator
from fleetgate.autoscale.local import LocalActuator
from fleetgate.autoscale.recommender import AutoscaleSettings, Recommender
from fleetgate.autoscale.scaler import Actuator, ActuatorFactory, PoolNow, PoolScaler
from fleetgate.batches.book import BatchBook
from fleetgate.batches.files import FileShelf
from fleetgate.batches.store import BatchStore
from fleetgate.clock import Clock
from fleetgate.config import (
    Config,
    ConfigError,
    PoolConfig,
)
from fleetgate.director.cache import ResponseCache
from fleetgate.director.director import Director
from fleetgate.discovery.found import Source
from fleetgate.discovery.reconcile import Discovery
from fleetgate.fleet.backend import REGION, Backend, BackendState
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
from fleetgate.http.forwarding import RequestHeaders
from fleetgate.http.transport import Transport
from fleetgate.lifecycle.accounting import FleetAccounting
from fleetgate.lifecycle.hooks import Emitters, Hooks
from fleetgate.observe.audit import AuditLog
from fleetgate.observe.live import LiveView
from fleetgate.observe.live_regions import RegionOf
from fleetgate.observe.metrics import GatewayMetrics
from fleetgate.observe.picks import LastPicks
from fleetgate.observe.request_log import RequestLog
from fleetgate.observe.slo import SloBook, fastest_burn
from fleetgate.observe.tracing import Tracing
from fleetgate.observe.usage import TenantUsage
from fleetgate.reload import (
    Kept,
    PoolAdmission,
    carry_pools,
)
from fleetgate.resilience.cluster import Cluster
from fleetgate.resilience.continuation import Continuation
from fleetgate.resilience.failover import Failover
from fleetgate.resilience.hedge import TtftWindow
from fleetgate.resilience.retry import RetryBudget
from fleetgate.routing.locality import NOWHERE, Locality, Place
from fleetgate.routing.models import Alias, LengthKeywords, ModelRoute, Split, Tiers
from fleetgate.routing.pipeline import RoutingPipeline
from fleetgate.routing.regions import LocalRegion
from fleetgate.routing.registry import (
    PluginContext,
    PluginRegistry,
    default_registry,
)
from fleetgate.routing.router import Router
from fleetgate.routing.slo_aware import Objectives
from fleetgate.routing.stores import EngineBlocks
from fleetgate.shared.state import RoutingState, StateSettings
from fleetgate.traffic.admission import Admission
from fleetgate.traffic.batch_lane import BatchLane
from fleetgate.traffic.concurrency import ConcurrencyLimit
from fleetgate.traffic.door import Caller, FrontDoor
from fleetgate.traffic.keys import ADMIN, HEARTBEAT, KeyRing, digest_of, read_key_file
from fleetgate.traffic.limits import Limits
from fleetgate.traffic.store import LimitStore, MemoryStore
from fleetgate.traffic.tenants import ANONYMOUS, Tenant
from fleetgate.upstream.attempt import Attempts
from fleetgate.upstream.prefill import Prefill

if TYPE_CHECKING:  # loaded only when a backend publishes KV-cache events (ZMQ: ~30 ms)
    from fleetgate.kv_events.feeds import KvEventFeeds

DISCOVERY_JITTER = 0.1  # each source read at its interval +- 10%


@dataclass(frozen=True, slots=True)
class ResolvedPool:
    """A pool whose backends all have URLs (embedded sims started, discovery done)."""

    config: PoolConfig
    backends: tuple[Backend, ...]
    prefill: tuple[Backend, ...] = ()  # prefill backends of a disaggregated pool


Built = tuple[Gateway, dict[str, Cluster]]  # a config's edge, and its pools' clusters


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
    here: Place = NOWHERE,
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
                engine_blocks=_engine_blocks(c.model, kv_events, state), here=here,
                objectives=Objectives(c.slo.ttft_s, c.slo.tpot_s),
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


def _parts(cluster: Cluster) -> tuple[Pool, ...]:
    """A cluster's pool, and its prefill pool when it is disaggregated."""
    if cluster.prefill is None:
        return (cluster.pool,)
    return (cluster.pool, cluster.prefill.router.pool)


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
    actuator: ActuatorFactory | None = None,
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
    runs in `background` is listed there (stopped when the next is in). `actuator`: what
    changes an autoscaled pool's replicas instead of its config's actuator (the simulator's);
    with shared state, the holder of the pool's lease acts."""
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
            live_rng = random.Random(rng.getrandbits(64))
            kept.live = LiveView(now, wall_clock, live_rng)
        live = kept.live
        # By region only where there are regions: a label on a backend, the gateway's own, or
        # backends found or added while running (they may carry one).
        placed = (
            config.server.region is not None
            or bool(config.discovery)
            or config.server.admin
            or any(REGION in b.labels for p in config.pools for b in p.every_backend())
        )
        live.count_regions(_region_of(kept) if placed else None)
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
            here=Place(config.server.region, config.server.zone),
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
    prefills = [c.prefill.router.pool for c in clusters.values() if c.prefill is not None]
    if kept.members is None:
        kept.members = Membership(pools, now, probes, prefills)
    else:
        kept.members.adopt(pools, prefills)
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
            autoscale=lambda: [s.status for s in kept.scalers.made() if s.status is not None],
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
    _autoscale(config, kept, members, slo, state, clocks=(now, wall_clock), background=background,
               actuator=actuator)  # fmt: skip
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
        dashboard=None if live is None else Dashboard(
            clusters, slo, live, usage, clock, wall_clock,
            regions=lambda: _local_regions(kept),
        ),
    )  # fmt: skip
    return gateway, clusters


def _local_regions(kept: Kept) -> Iterator[tuple[str, str, LocalRegion]]:
    """Each pool's locality filter's view of the gateway's region: (model, region, state)."""
    for model, cluster in kept.clusters.items():
        for f in cluster.router.pipeline.filters:
            if isinstance(f, Locality):
                yield model, f.here.region or "", f.local


def _region_of(kept: Kept) -> RegionOf:
    """The live view's region of a request: its backend's `region` label, looked up by its
    pool and id in the config in use ("" when it has none, or has left the pool since)."""

    def region_of(model: str, backend: str) -> str:
        cluster = kept.clusters.get(model)
        state = None if cluster is None else cluster.pool.members.get(backend)
        return "" if state is None else state.backend.labels.get(REGION, "")

    return region_of


def _autoscale(
    config: Config,
    kept: Kept,
    members: Membership,
    slo: SloBook,
    state: RoutingState,
    *,
    clocks: tuple[Callable[[], float], Callable[[], float]],
    background: PeriodicTasks | None,
    actuator: ActuatorFactory | None = None,
) -> None:
    """Each autoscaled pool's scaler (kept while its settings are the same), run every
    `interval_s` in `background`; a pool no longer autoscaled lets its scaler go. With state
    shared among gateways, the Kubernetes actuator acts on the holder of the pool's lease
    alone (each gateway's local actuator starts workers of its own: no lease)."""
    for c in config.pools:
        settings, model = c.autoscale, c.model
        if not settings.enabled:
            kept.scalers.drop(model)
            continue

        def view(model: str = model, stale_after_s: float = c.engine_metrics.stale_after_s
                 ) -> PoolNow | None:  # fmt: skip
            cluster = kept.clusters.get(model)
            if cluster is None:
                return None
            queued = 0 if cluster.admission is None else cluster.admission.waiting
            burn = fastest_burn(slo.status().get(model, []))
            return PoolNow(cluster.router.pool, queued, burn, stale_after_s)

        def make(model: str = model, settings: AutoscaleSettings = settings,
                 view: Callable[[], PoolNow | None] = view) -> PoolScaler:  # fmt: skip
            made: Actuator | None = None
            if actuator is not None:  # the simulator's
                made = actuator(model)
            elif settings.kubernetes is not None:
                try:
                    made = KubernetesActuator(settings.kubernetes, clock=clocks[0])
                except ActuatorUnavailable as exc:
                    raise ConfigError(f"pool {model!r} autoscale.kubernetes: {exc}") from None
            elif settings.local is not None:
                made = LocalActuator(model, settings.local, members)
            lease = None
            # One fleet (a Kubernetes workload, a simulated one), several gateways: the lease
            # holder acts (each gateway's local actuator starts workers of its own: no lease).
            if state.shared and made is not None and not isinstance(made, LocalActuator):
                lease = state.lease("autoscale", model, max(2.0, 3 * settings.interval_s))
            return PoolScaler(
                view, Recommender(settings), made, members, clocks=clocks, model=model,
                lease=lease, smoothing_s=settings.smoothing_s,
            )  # fmt: skip

        scaler = kept.scalers.get(model, settings, make)
        if background is not None:
            stop = background.every(settings.interval_s, 0.05, scaler.tick, wait_first=True)
            kept.tasks.append(stop)


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
        autoscale=lambda: [s.status for s in kept.scalers.made() if s.status is not None],
        regions=lambda: _local_regions(kept),
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


def check_routing(config: Config, registry: PluginRegistry) -> None:
    """ConfigError when a pool's routing cannot be built (as `build_clusters` would say),
    built on throw-away stores: a reload checks it before changing anything running."""
    for pool in config.pools:
        ctx = PluginContext(random.Random(0), MemoryLoadBoard(), pool.engine_metrics.stale_after_s)
        _pipeline(pool, registry, ctx, False)
        if pool.prefill is not None:
            _pipeline(pool, registry, ctx, True)


def _engine_blocks(
    model: str, kv_events: KvEventFeeds | None, state: RoutingState
) -> EngineBlocks | None:
    """What the pool's engines report holding (None: none publishes), with what the other
    gateways sent them, when shared."""
    index = None if kv_events is None else kv_events.index(model)
    return None if index is None else state.engine_blocks(model, index)
