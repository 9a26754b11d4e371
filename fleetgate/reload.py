"""A running gateway's config replaced without a restart (SIGHUP, its file changing, or
POST /admin/config): what is refused, what carries over, how the members follow.

A new config is checked exactly as at start, then built beside the running one: new routing
pipelines, tenants, keys, limits, admission, SLOs and edge, over the same pools (serve.py
`compose` with what `Kept` holds). The server then hands each new request to the new edge;
a request in flight finishes on what it started with. What was learned carries over:

    pools        a pool still configured keeps its members and what was measured of them
                 (latency, calibration, health, ejections, in-flight counts): its settings
                 are replaced (`Pool.configure`), a configured backend it still has is
                 reconfigured in place, one added joins at a slow start (routable at once,
                 as at start), one no longer configured is drained, then leaves;
                 those the operator or discovery added while it ran stay
    admission    a pool's queue and concurrency limit, while its settings and the tenants
                 are those it was made with
    state        routing state (load boards, prefix index, sessions), limits' counts, the
                 metrics, the dashboard's history, SLO windows whose objectives are the same

What a process takes only at its start (where it listens, its TLS files, where state and
limits are kept, tracing, batches, discovery sources, the embedded sim workers, which
backends publish KV-cache events) cannot change: a config that changes it is refused, like
a broken one, and the running one is kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Generic, TypeVar

import yaml

from fleetgate.autoscale.scaler import PoolScaler
from fleetgate.config import (
    Config,
    ConfigError,
    PoolConfig,
    load_config,
    parse_config,
)
from fleetgate.fleet.backend import Backend
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.membership import Membership
from fleetgate.fleet.pool import Pool
from fleetgate.gateway.redact import REDACTED
from fleetgate.observe.reloads import ReloadStatus

if TYPE_CHECKING:
    from fleetgate.director.cache import CacheSettings, ResponseCache
    from fleetgate.discovery.reconcile import Discovery
    from fleetgate.gateway.app import RequestIds
    from fleetgate.gateway.batch_api import BatchApi
    from fleetgate.health.outlier import OutlierDetector
    from fleetgate.health.probes import BackendProbes
    from fleetgate.observe.audit import AuditLog
    from fleetgate.observe.live import LiveView
    from fleetgate.observe.metrics import GatewayMetrics
    from fleetgate.observe.picks import LastPicks
    from fleetgate.observe.request_log import RequestLog, RequestLogSettings
    from fleetgate.observe.slo import SloBook
    from fleetgate.observe.usage import TenantUsage
    from fleetgate.resilience.cluster import Cluster
    from fleetgate.resilience.hedge import TtftWindow
    from fleetgate.routing.pipeline import RoutingPipeline
    from fleetgate.routing.registry import PluginContext
    from fleetgate.routing.stores import ResponsePins
    from fleetgate.traffic.admission import Admission
    from fleetgate.traffic.batch_lane import BatchLane
    from fleetgate.traffic.concurrency import ConcurrencyLimit

log = logging.getLogger("fleetgate.reload")
T = TypeVar("T")

# server: what the edge reads (made again on each config); every other field is the listener's.
RELOADABLE_SERVER = frozenset(
    {
        "admin", "metrics", "dashboard", "audit_log", "deny_request_headers",
        "passthrough_paths", "drain_timeout_s",
    }
)  # fmt: skip
RESTART_SECTIONS = ("seed", "state", "tracing", "batches", "discovery")
RESTART_LIMITS = ("store", "redis_url", "key_prefix")


def restart_only_changes(old: Config, new: Config) -> list[str]:
    """What `new` changes that only a restart applies (empty: it may be reloaded)."""
    changed = [
        f"server.{name}"
        for name in old.server.__struct_fields__
        if name not in RELOADABLE_SERVER and getattr(old.server, name) != getattr(new.server, name)
    ]
    changed += [
        f"limits.{name}"
        for name in RESTART_LIMITS
        if getattr(old.limits, name) != getattr(new.limits, name)
    ]
    changed += [s for s in RESTART_SECTIONS if getattr(old, s) != getattr(new, s)]
    if _sims(old) != _sims(new):
        changed.append("the pools' `sim:` backends")
    if _publishers(old) != _publishers(new):
        changed.append("the backends with `kv_events`")
    return changed


def check_reloadable(old: Config, new: Config) -> None:
    """ConfigError when `new` changes what only a restart applies."""
    changed = restart_only_changes(old, new)
    if changed:
        raise ConfigError(
            f"{', '.join(changed)} changed: these take effect only at a restart; restart the "
            "gateway (or put them back) to reload"
        )


# Files a config names, which a config sent over the network (POST /admin/config) may not
# change: the admin key would otherwise choose what the gateway reads and appends to.
def _files(config: Config) -> dict[str, str | None]:
    return {
        "auth.key_file": config.auth.key_file,
        "server.audit_log": config.server.audit_log,
        "request_log.path": config.request_log.path,
    }


def check_posted(old: Config, new: Config) -> None:
    """ConfigError when a config sent to the admin API names other files than the one in use."""
    before, after = _files(old), _files(new)
    changed = [name for name in before if before[name] != after[name]]
    if changed:
        raise ConfigError(
            f"{', '.join(changed)}: a config sent to /admin/config may not change the files "
            "the gateway reads or writes; change them in the config file"
        )


MAX_POSTED_BYTES = 1 << 20  # a config of thousands of backends is far less
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when PyYAML has it


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """Where a running gateway's config comes from: its file (None: the built-in fleet, or
    pools asked of `--backend` servers) and what the command line changes in every config
    it reads (`adjust`: --host, --port, --state, --policy)."""

    path: str | None
    adjust: Callable[[Config], Awaitable[Config]]

    async def read(self) -> Config:
        """The file again (one there is: RunningGateway.reload_file asks); ConfigError as at
        start."""
        assert self.path is not None
        return await self.adjust(load_config(self.path))

    async def parse(self, text: bytes) -> Config:
        """A config sent whole (YAML or JSON, at most MAX_POSTED_BYTES), parsed off the event
        loop; ConfigError as a file's, but naming only where a syntax error is (the text may
        hold keys)."""
        if len(text) > MAX_POSTED_BYTES:
            raise ConfigError(f"the config sent is over {MAX_POSTED_BYTES // 1024} KiB")
        if REDACTED.encode() in text:
            raise ConfigError(
                f"the config sent holds {REDACTED!r} (as GET /admin/config shows secrets): "
                "send the real keys and URLs"
            )
        try:
            data = await asyncio.to_thread(yaml.load, text, Loader=_LOADER)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            where = "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"
            raise ConfigError(f"the config sent is not valid YAML or JSON{where}") from None
        except (yaml.YAMLError, RecursionError, ValueError) as exc:
            kind = type(exc).__name__
            raise ConfigError(f"the config sent is not valid YAML or JSON ({kind})") from None
        return await self.adjust(parse_config(data))


def _sims(config: Config) -> list[tuple[str, str]]:
    """The embedded sim workers, in the order they are started (running.py `start_sims`)."""
    return [(p.model, b.sim) for p in config.pools for b in p.every_backend() if b.sim is not None]


def _publishers(config: Config) -> set[tuple[str, str | None, object]]:
    return {
        (p.model, b.url or b.sim, b.kv_events)
        for p in config.pools
        for b in p.backends
        if b.kv_events is not None
    }


class Keeper(Generic[T]):
    """Things of each pool made from its settings: the one made from equal settings is given
    again (with what it learned), else a new one; `let_go` is given each one replaced or
    dropped, to release what it holds."""

    def __init__(self, let_go: Callable[[T], None] | None = None) -> None:
        self._made: dict[str, tuple[object, T]] = {}
        self._let_go = let_go

    def get(self, name: str, made_from: object, make: Callable[[], T]) -> T:
        old = self._made.get(name)
        if old is not None and old[0] == made_from:
            return old[1]
        made = make()
        self._made[name] = (made_from, made)
        if old is not None and self._let_go is not None:
            self._let_go(old[1])
        return made

    def made(self) -> list[T]:
        """What it holds now."""
        return [made for _, made in self._made.values()]

    def drop_all(self) -> None:
        for name in list(self._made):
            self.drop(name)

    def drop(self, name: str) -> None:
        old = self._made.pop(name, None)
        if old is not None and self._let_go is not None:
            self._let_go(old[1])


def _close_limit(admission: PoolAdmission) -> None:
    admission.limit.close()  # its watch of the (shared) board's gateway count


@dataclass(frozen=True, slots=True)
class PoolAdmission:
    """A pool's admission and the parts that hear its events."""

    admission: Admission
    limit: ConcurrencyLimit
    lane: BatchLane


@dataclass(slots=True)
class Kept:
    """What a running gateway keeps from one config to the next. serve.py `compose` makes
    what is missing and leaves it here; its tasks are stopped when the next config is in."""

    ids: RequestIds
    pools: dict[str, Pool] = field(default_factory=dict)  # each pool, by name ("m:prefill")
    configured: dict[str, set[str]] = field(default_factory=dict)  # its backends' ids, by name
    clusters: dict[str, Cluster] = field(default_factory=dict)  # the config's now
    # Each pool's routing stores (its load board, prefix index, sessions), for good.
    contexts: dict[str, PluginContext] = field(default_factory=dict)
    pipelines: Keeper[RoutingPipeline] = field(default_factory=Keeper)
    admissions: Keeper[PoolAdmission] = field(default_factory=lambda: Keeper(_close_limit))
    outliers: Keeper[OutlierDetector] = field(default_factory=Keeper)
    ttfts: Keeper[TtftWindow] = field(default_factory=Keeper)
    scalers: Keeper[PoolScaler] = field(default_factory=lambda: Keeper(PoolScaler.close))
    pins: ResponsePins | None = None  # the Responses API's, one for every pool
    members: Membership | None = None
    probes: BackendProbes | None = None
    discovery: Discovery | None = None
    metrics: GatewayMetrics | None = None
    usage: TenantUsage | None = None
    slo: SloBook | None = None
    live: LiveView | None = None
    picks: LastPicks | None = None
    audit: tuple[str, AuditLog] | None = None  # with its path
    request_log: tuple[RequestLogSettings, RequestLog] | None = None  # with its settings
    request_logs: list[RequestLog] = field(default_factory=list)  # every one opened: flushed
    cache: tuple[CacheSettings, ResponseCache] | None = None  # with its settings
    batch_api: BatchApi | None = None  # the batches run on, whatever the config
    reloads: ReloadStatus = field(default_factory=lambda: ReloadStatus())
    # A config sent to POST /admin/config, applied (ConfigError: refused); None until started.
    reload_posted: Callable[[bytes], Awaitable[None]] | None = None
    tasks: list[Callable[[], None]] = field(default_factory=list)  # the config's own

    def stop_tasks(self) -> None:
        for stop in self.tasks:
            stop()
        self.tasks.clear()


def carry_pools(
    kept: Kept,
    pools: Sequence[tuple[PoolConfig, Sequence[Backend], Sequence[Backend]]],
    now: float,
) -> None:
    """The pools `kept` holds, made to follow a reloaded config's `pools` (each: its config,
    its decode backends, its prefill backends): settings, probes and members; those it no
    longer has are dropped (their requests in flight finish; nothing probes them)."""
    members, probes = kept.members, kept.probes
    assert members is not None and probes is not None  # a running gateway's
    wanted: set[str] = set()
    for config, backends, prefill in pools:
        parts = [(config.model, backends)]
        if config.prefill is not None:
            parts.append((f"{config.model}:prefill", prefill))
        for name, part in parts:
            wanted.add(name)
            pool = kept.pools.get(name)
            if pool is None:
                continue  # new: made as at start
            pool.configure(config.health(), config.weights, now)
            probes.restart(pool, config.health_check, config.engine_metrics)
            _forget_switched_off(pool, config, now)
            kept.configured[name] = carry_pool(
                name, pool, part, members, kept.configured.get(name, set()), now=now
            )
    for name in [n for n in kept.pools if n not in wanted]:
        probes.stop(kept.pools.pop(name))
        kept.configured.pop(name, None)
        for keeper in (kept.pipelines, kept.admissions, kept.outliers, kept.ttfts, kept.scalers):
            keeper.drop(name)
        log.info("reload: the pool %s is no longer configured", name)


def _forget_switched_off(pool: Pool, config: PoolConfig, now: float) -> None:
    """Clear what a detector the config turned off had set: nothing would clear it again."""
    off = HealthFlag(0)
    if not config.health_check.enabled:
        off |= HealthFlag.ACTIVE_CHECK_FAILED | HealthFlag.UNPROBED
    if not config.gpu.enabled:
        off |= HealthFlag.GPU_FAULT
    for state in pool.states:
        if state.flags & off & HealthFlag.UNPROBED:
            state.ramp_from = now  # let in, at a slow start, as a good probe would
        state.flags &= ~off
        if not config.gpu.enabled:
            pool.throttle(state, 1.0, now)
    pool.refresh(now)


def carry_pool(
    name: str,
    pool: Pool,
    backends: Iterable[Backend],
    members: Membership,
    configured: set[str],
    *,
    now: float,
) -> set[str]:
    """Make the members of `pool` (named `name`) follow its reloaded `backends`: those kept
    are reconfigured, new ones join at a slow start (routable at once, as a config's backends
    are at start: a config that replaces every backend must not leave the pool empty while
    the new ones wait for a probe; the probes take out one that fails), those the last
    config had (`configured`) and this one has not are drained and leave. Returns the ids
    configured now."""
    now_ids: set[str] = set()
    for backend in backends:
        now_ids.add(backend.id)
        state = pool.members.get(backend.id)
        if state is None:
            named = replace(backend, name=members.new_name(pool.model))
            members.join(pool, named, probe_first=False, slow_start=True)
            log.info("reload: %s joins %s", backend.id, name)
        else:
            if pool.retiring(state):  # dropped by the last config, listed again by this one
                pool.rejoin(state, now)
            pool.reconfigure(state, replace(backend, name=state.backend.name), now)
    for gone in configured - now_ids:
        state = pool.members.get(gone)
        if state is not None and not pool.retiring(state):
            pool.retire(state, now)
            log.info("reload: %s leaves %s (drained first)", gone, name)
    return now_ids
