"""The gateway's configuration: one YAML file, validated once at start into frozen objects.

One schema per concept: a section decodes straight into the settings class of the part it
configures (`health_check:` into health/active.py's ActiveCheckSettings, `retries:` into
resilience/retry.py's RetrySettings, ...), whose defaults and checks sit next to its fields
(fleetgate/settings.py); what is only the gateway's is defined here. Every key and default is
in docs/configuration.md. An unknown key, a value of the wrong type or out of range is a
`ConfigError` that names where it is (`$.pools[0].polcy`).
"""

from __future__ import annotations

import ipaddress
import math
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import yaml

from fleetgate.autoscale.recommender import AutoscaleSettings
from fleetgate.batches.settings import BatchesSettings
from fleetgate.director.cache import CacheSettings
from fleetgate.discovery.settings import RedisDiscovery, SourceConfig
from fleetgate.fleet.calibration import WeightSettings
from fleetgate.fleet.engines import KINDS
from fleetgate.fleet.health import HealthSettings
from fleetgate.fleet.scraper import ScrapeSettings
from fleetgate.health.active import ActiveCheckSettings
from fleetgate.health.gpu import GpuSettings
from fleetgate.health.outlier import OutlierSettings
from fleetgate.http.client import Origin
from fleetgate.http.server import ServerLimits
from fleetgate.kv_events.settings import KvEventsConfig
from fleetgate.observe.request_log import RequestLogSettings
from fleetgate.observe.slo import SloSettings
from fleetgate.observe.tracing import TracingSettings
from fleetgate.resilience.hedge import HedgeSettings
from fleetgate.resilience.retry import RetrySettings
from fleetgate.routing.pipeline import SHORTLIST
from fleetgate.routing.registry import DEFAULT_POLICY, PluginSpec, Profile
from fleetgate.settings import Settings, at_least, positive_seconds, within
from fleetgate.shared.state import StateSettings
from fleetgate.traffic.admission import AdmissionSettings
from fleetgate.traffic.keys import digest_of
from fleetgate.traffic.limits import PricingSettings
from fleetgate.traffic.tenants import TenantSettings
from fleetgate.upstream.timeouts import Timeouts
from fleetgate.workers.sim.profiles import PROFILES

_TIMEOUTS = Timeouts()
_HEALTH = HealthSettings()


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and says what is expected."""


PASSTHROUGH_PATHS = (
    "/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score", "/tokenize", "/detokenize",
    "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/moderations", "/pooling",
    "/classify",
)  # fmt: skip
# The gateway's own model paths (gateway/app.py): never passed through as they are.
OWN_PATHS = frozenset(
    ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
     "/v1/models", "/healthz", "/readyz", "/metrics", "/dashboard", "/v1/files", "/v1/batches")
)  # fmt: skip
_PATH = re.compile(r"/[A-Za-z0-9._~/-]{1,200}").fullmatch


class ServerConfig(ServerLimits, frozen=True):
    """The `server:` section: where to listen, plus the HTTP limits (http/server.py)."""

    host: str = "127.0.0.1"  # address the gateway listens on
    port: int = 8080  # port the gateway listens on; 0 picks a free one
    connect_timeout_s: float = 5.0  # discovery and health probes connecting to a backend
    drain_timeout_s: float = 30.0  # on SIGTERM/Ctrl-C, requests in progress get this long
    admin: bool = False  # serve /admin/* (draining backends); keep off on exposed ports
    metrics: bool = True  # serve /metrics (Prometheus), counting every request's events
    dashboard: bool = True  # serve the live dashboard at /dashboard (behind the admin key)
    audit_log: str | None = None  # append admin actions and failed keys here (JSON lines)
    tls_cert_file: str | None = None  # serve HTTPS with this certificate chain (PEM)...
    tls_key_file: str | None = None  # ...and this private key (PEM); both or neither
    tls_reload_s: float = 10.0  # how often the two files are checked for a renewal
    # Reload the --config file when it changes, checked this often (0: on SIGHUP alone).
    watch_config_s: float = 0.0
    # Where this gateway runs (routing/locality.py); None: FLEETGATE_REGION / _ZONE, if set.
    region: str | None = None
    zone: str | None = None
    # Client request headers never passed to a backend, besides the hop-by-hop ones, host,
    # content-length, authorization, expect and x-fleetgate-* (http/forwarding.py): by
    # default cookies and the other ways clients send API keys.
    deny_request_headers: tuple[str, ...] = ("cookie", "x-api-key", "api-key")
    # Other model paths the backends serve, passed through as they are and routed by their
    # `model` (a JSON field, or a multipart form field): vLLM's and SGLang's by default.
    passthrough_paths: tuple[str, ...] = PASSTHROUGH_PATHS

    def __post_init__(self) -> None:
        super().__post_init__()
        for path in self.passthrough_paths:
            if (
                not _PATH(path)
                or path in OWN_PATHS
                or path.startswith(
                    ("/admin/", "/fleet/", "/dashboard", "/v1/files/", "/v1/batches/")
                )
            ):
                raise ValueError(
                    f"`passthrough_paths`: {path!r} is not a path a backend serves apart from "
                    "the gateway's own (/v1/path, no query)"
                )
        within("port", self.port, 0, 65535)
        positive_seconds("connect_timeout_s", self.connect_timeout_s)
        positive_seconds("tls_reload_s", self.tls_reload_s)
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("give both `tls_cert_file` and `tls_key_file`, or neither")
        positive_seconds("drain_timeout_s", self.drain_timeout_s)
        at_least("watch_config_s", self.watch_config_s, 0)


class BackendConfig(Settings, frozen=True):
    url: str | None = None  # an OpenAI-compatible server, e.g. http://10.0.0.5:8000
    sim: str | None = None  # or: an embedded simulated worker with this engine profile
    weight: float = 1.0  # relative share for weight-aware policies
    labels: dict[str, str] = {}  # free-form: region, zone, accelerator, tier
    max_in_flight: int | None = None  # at this many requests in flight routing skips it
    api_key: str | None = None  # sent to this backend as `Authorization: Bearer` (not logged)
    cost_per_hour_usd: float = 0.0  # what its GPUs cost an hour (fleetgate_backend_cost_*)
    # What serves it (fleet/engines.py): auto probes it; or vllm, sglang, llamacpp, tgi,
    # ollama, fleetgate, openai (any other OpenAI-compatible server).
    engine: str = "auto"
    # Its engine's KV-cache events (kv_events/): what it holds, for prefix routing.
    kv_events: KvEventsConfig | None = None

    def __post_init__(self) -> None:
        if self.engine not in KINDS:
            raise ValueError(f"`engine`: {self.engine!r} is not one of {', '.join(KINDS)}")
        if not 0 <= self.cost_per_hour_usd < math.inf:
            raise ValueError(f"`cost_per_hour_usd` must be >= 0, got {self.cost_per_hour_usd}")
        if self.api_key is not None and (not self.api_key.isprintable() or not self.api_key):
            raise ValueError("`api_key` must be printable text")
        if (self.url is None) == (self.sim is None):
            raise ValueError("give exactly one of `url` or `sim`")
        if not 0 < self.weight < math.inf:  # also refuses NaN
            raise ValueError(f"`weight` must be a finite number > 0, got {self.weight}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError("`max_in_flight` must be >= 1 (or absent: no limit)")
        if self.url is not None:
            try:
                Origin.parse(self.url)
            except ValueError as exc:
                raise ValueError(f"`url`: {exc}") from None
        events = self.kv_events
        if events is not None and (events.endpoint is None) != (self.sim is not None):
            raise ValueError(
                "`kv_events.endpoint`: give the engine's (a `url` backend's), or none for a"
                " `sim` backend (its worker publishes on ports of its own)"
            )
        if self.sim is not None and self.sim not in PROFILES:
            known = ", ".join(sorted(PROFILES))
            raise ValueError(f"`sim`: no profile {self.sim!r}; known: {known}")


class RoutingConfig(Settings, frozen=True):
    """A composed routing profile (docs/configuration.md, "Composed routing")."""

    filters: list[dict[str, Any]] = []  # each {type: NAME, ...its parameters}
    scorers: list[dict[str, Any]] = []  # each {type: NAME, weight: W, ...its parameters}
    picker: str = "max_score"  # chooses one candidate from the combined scores
    shortlist: int = SHORTLIST  # at most this many candidates scored per pick (others sampled)

    def profile(self, where: str) -> Profile:
        """The profile this section describes; a ConfigError names a malformed entry."""
        filters = tuple(
            _plugin_spec(f, f"{where}.filters[{i}]") for i, f in enumerate(self.filters)
        )
        scorers = []
        for i, entry in enumerate(self.scorers):
            at = f"{where}.scorers[{i}]"
            weight = entry.get("weight")
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
                raise ConfigError(f"{at}.weight: give each scorer a number > 0, got {weight!r}")
            params = {k: v for k, v in entry.items() if k != "weight"}
            scorers.append((_plugin_spec(params, at), float(weight)))
        if not scorers:
            raise ConfigError(f"{where}.scorers is empty: give at least one weighted scorer")
        if self.shortlist < 1:
            raise ConfigError(f"{where}.shortlist must be >= 1")
        return Profile(tuple(scorers), self.picker, filters, self.shortlist)


def _plugin_spec(entry: dict[str, Any], where: str) -> PluginSpec:
    kind = entry.get("type")
    if not isinstance(kind, str):
        raise ConfigError(f"{where}.type: name the plugin, e.g. `type: queue`")
    return PluginSpec(kind, {k: v for k, v in entry.items() if k != "type"})


class PrefillConfig(Settings, frozen=True):
    """Prefill/decode disaggregation: the pool's `backends` decode, these prefill."""

    backends: list[BackendConfig]  # the prefill engines (vLLM with a KV connector, or sims)
    policy: str = DEFAULT_POLICY  # how one of them is chosen, by name as `pools[].policy`

    def __post_init__(self) -> None:
        if not self.backends:
            raise ValueError("`backends` is empty: give at least one")


class PoolConfig(Settings, frozen=True):
    model: str  # the `model` clients send
    backends: list[BackendConfig]
    policy: str = DEFAULT_POLICY  # a routing policy or profile by name (docs/configuration.md)
    policy_params: dict[str, Any] = {}  # parameters of that policy, if it has any
    routing: RoutingConfig | None = None  # or a composed profile (then leave `policy` out)
    # How long to wait on a backend; the defaults live with upstream/timeouts.py, Timeouts.
    first_byte_timeout_s: float = _TIMEOUTS.first_byte_s  # until the answer's head, or 504
    total_timeout_s: float = _TIMEOUTS.total_s  # the whole answer, stream included, or 504
    idle_timeout_s: float = _TIMEOUTS.idle_s  # longest silence between stream chunks
    connect_timeout_s: float = _TIMEOUTS.connect_s  # opening a connection for a request
    health_check: ActiveCheckSettings = ActiveCheckSettings()  # active probes (health/active.py)
    hedge: HedgeSettings = HedgeSettings()  # hedged streams, off unless enabled (hedge.py)
    outlier: OutlierSettings = OutlierSettings()  # ejection on failures seen in traffic
    gpu: GpuSettings = GpuSettings()  # GPU agents' readings: thresholds (health/gpu.py)
    retries: RetrySettings = RetrySettings()  # trying another backend before the first byte
    engine_metrics: ScrapeSettings = ScrapeSettings()  # backends' own load (fleet/scraper.py)
    weights: WeightSettings = WeightSettings()  # self-calibrating weights (calibration.py)
    prefill: PrefillConfig | None = None  # disaggregated: prefill here, decode on `backends`
    pricing: PricingSettings = PricingSettings()  # its tokens' price, for budgets and spend
    admission: AdmissionSettings = AdmissionSettings()  # queueing and shedding when saturated
    slo: SloSettings = SloSettings()  # objectives and their burn rates (observe/slo.py)
    autoscale: AutoscaleSettings = AutoscaleSettings()  # replicas it should run (autoscale/)
    # The backends schedule by a request's `priority` (vLLM --scheduling-policy priority; the
    # pool's embedded sims run so): each request is sent with its class's, lower first.
    engine_priority: bool = False
    # Below this share of healthy backends, route across all (fleetgate/fleet/health.py).
    panic_threshold: float = _HEALTH.panic_threshold
    slow_start_s: float = _HEALTH.slow_start_s  # a returning backend ramps up over this

    def __post_init__(self) -> None:
        if self.routing is not None and (self.policy != DEFAULT_POLICY or self.policy_params):
            raise ValueError("give `policy` or `routing`, not both")
        for name in ("first_byte_timeout_s", "total_timeout_s", "idle_timeout_s",
                     "connect_timeout_s"):  # fmt: skip
            positive_seconds(name, getattr(self, name))
        within("panic_threshold", self.panic_threshold, 0, 1)
        at_least("slow_start_s", self.slow_start_s, 0)

    def every_backend(self) -> list[BackendConfig]:
        """Its decode (or only) backends, then its prefill backends."""
        return [*self.backends, *(self.prefill.backends if self.prefill is not None else ())]

    def health(self) -> HealthSettings:
        return HealthSettings(self.panic_threshold, self.slow_start_s)

    def timeouts(self) -> Timeouts:
        return Timeouts(
            self.first_byte_timeout_s, self.total_timeout_s, self.idle_timeout_s,
            self.connect_timeout_s,
        )  # fmt: skip


class ShareConfig(Settings, frozen=True):
    model: str  # a pool's model
    weight: float  # its relative share of the split, > 0


class TiersConfig(Settings, frozen=True):
    cheap: str  # the pool requests go to unless they are hard
    strong: str  # the pool hard requests go to
    max_prompt_tokens: int = 2048  # a prompt this long (estimated) is hard
    keywords: list[str] = []  # a prompt containing one of these (any case) is hard


class ModelRouteConfig(Settings, frozen=True):
    """A model name clients may send that is not a pool (docs/configuration.md, "Models")."""

    name: str  # what clients send
    alias: str | None = None  # another name for this pool
    split: list[ShareConfig] | None = None  # or: weighted shares between pools
    tiers: TiersConfig | None = None  # or: a cheap pool unless the request is hard


class AuthConfig(Settings, frozen=True):
    """Who may call (docs/configuration.md, "Tenants and keys"): tenants' keys are in
    `tenants:`; these are the operator's."""

    enabled: bool | None = None  # None: on when a tenant has keys or `key_file` is given
    admin_keys: list[str] = []  # for /admin/* (clear or `sha256:<hex>`)
    heartbeat_keys: list[str] = []  # for workers' POST /fleet/heartbeat
    key_file: str | None = None  # more keys, one `OWNER KEY` per line (traffic/keys.py)

    def __post_init__(self) -> None:
        for key in (*self.admin_keys, *self.heartbeat_keys):
            digest_of(key)  # a malformed key fails here, naming the field's section


class LimitsConfig(Settings, frozen=True):
    """Where rate limits and budgets are counted (traffic/store.py)."""

    store: str = "memory"  # memory: this gateway alone; redis: shared by several gateways
    redis_url: str | None = None  # redis://host:port/db, for `store: redis`
    key_prefix: str = "fleetgate"  # of the Redis keys, to share one Redis between fleets
    assumed_output_tokens: int = 256  # reserved for a request that sends no `max_tokens`

    def __post_init__(self) -> None:
        if self.store not in ("memory", "redis"):
            raise ValueError(f"`store` must be memory or redis, got {self.store!r}")
        if self.store == "redis" and not self.redis_url:
            raise ValueError("`store: redis` needs `redis_url`")
        at_least("assumed_output_tokens", self.assumed_output_tokens, 1)


class Config(Settings, frozen=True):
    server: ServerConfig = ServerConfig()
    pools: list[PoolConfig] = []
    models: list[ModelRouteConfig] = []  # aliases, splits and tiers over the pools
    seed: int | None = None  # seeds routing's random choices; None draws one at start
    auth: AuthConfig = AuthConfig()  # API keys; off unless tenants have keys
    tenants: list[TenantSettings] = []  # who may call, and their limits (traffic/tenants.py)
    limits: LimitsConfig = LimitsConfig()  # where limits are counted
    request_log: RequestLogSettings = RequestLogSettings()  # a line per request (observe/)
    tracing: TracingSettings = TracingSettings()  # OpenTelemetry spans over OTLP/HTTP, off
    batches: BatchesSettings = BatchesSettings()  # the Batch API: files, batches, their runner
    state: StateSettings = StateSettings()  # routing state shared with other gateways (Redis)
    cache: CacheSettings = CacheSettings()  # answers served again, identical requests coalesced
    # Sources of backends found while running (discovery/), besides each pool's `backends`.
    discovery: list[SourceConfig] = []

    @property
    def auth_enabled(self) -> bool:
        if self.auth.enabled is not None:
            return self.auth.enabled
        return self.auth.key_file is not None or any(t.keys for t in self.tenants)


def check_config(config: Config) -> Config:
    """Rules across sections that no one section can state; raises ConfigError. (Each
    section checks its own fields as it is decoded: see its class.)"""
    if not config.pools:
        raise ConfigError("`pools` is empty: configure at least one pool with backends")
    seen: set[str] = set()
    for i, pool in enumerate(config.pools):
        where = f"$.pools[{i}]"
        if pool.model in seen:
            raise ConfigError(f"{where}.model: {pool.model!r} has two pools; merge them")
        seen.add(pool.model)
        if not pool.backends and not config.discovery and pool.autoscale.local is None:
            raise ConfigError(
                f"{where}.backends is empty: give the pool at least one backend, `discovery:`"
                " sources that find them, or an autoscale actuator that starts them"
            )
        if pool.routing is not None:
            pool.routing.profile(f"{where}.routing")
    _check_models(config, seen)
    _check_tenants(config)
    check_redis_url(config.limits.redis_url, "$.limits.redis_url")
    check_redis_url(config.state.url, "$.state.url")
    for i, source in enumerate(config.discovery):
        if isinstance(source, RedisDiscovery):
            check_redis_url(source.url, f"$.discovery[{i}].url")
    if config.cache.store == "redis" and config.state.url is None:
        raise ConfigError("$.cache.store: redis keeps answers in the Redis of `state.url`; set it")
    return config


def check_redis_url(url: str | None, where: str) -> None:
    """A URL the Redis client can use, checked at start rather than at the first request (the
    messages never repeat the URL: it may hold a password)."""
    if url is None:
        return
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(
            f"{where}: give redis://host:port/db (or rediss://, unix://), not {parts.scheme}://"
        )
    if parts.scheme == "unix":
        if not parts.path:
            raise ConfigError(f"{where}: a unix:// URL needs the socket's path")
        return
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        port = 0
    if not parts.hostname or port == 0:
        raise ConfigError(f"{where}: give a host, and a port in 1-65535 if not 6379")
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise ConfigError(f"{where}: the path is the database's number (/0), got {parts.path!r}")


def _check_tenants(config: Config) -> None:
    names: set[str] = set()
    keys: set[bytes] = set()
    for i, tenant in enumerate(config.tenants):
        where = f"$.tenants[{i}]"
        if tenant.name in names or tenant.name == "anonymous":
            raise ConfigError(f"{where}.name: {tenant.name!r} is given twice")
        names.add(tenant.name)
        for j, key in enumerate(tenant.keys):
            try:
                digest = digest_of(key)
            except ValueError as exc:
                raise ConfigError(f"{where}.keys[{j}]: {exc}") from None
            if digest in keys:
                raise ConfigError(f"{where}.keys[{j}]: this key is already given")
            keys.add(digest)
    if config.auth.enabled and not config.tenants and config.auth.key_file is None:
        raise ConfigError("$.auth.enabled: no tenant has keys; add `tenants:` or a `key_file`")
    if config.server.admin and not config.auth_enabled and not _loopback(config.server.host):
        # Anyone who reached the port could add their own server as a backend and read what
        # tenants send it.
        raise ConfigError(
            "$.server.admin: with auth off the admin API listens only on a loopback address "
            f"(not {config.server.host!r}); give tenants keys and `auth.admin_keys`, or "
            "`server.host: 127.0.0.1`"
        )
    gpu = [i for i, pool in enumerate(config.pools) if pool.gpu.enabled]
    if gpu and not config.auth_enabled and not _loopback(config.server.host):
        # Anyone who reached the port could report a GPU fault and take a backend out.
        raise ConfigError(
            f"$.pools[{gpu[0]}].gpu.enabled: with auth off GPU readings are taken only on a "
            f"loopback address (not {config.server.host!r}); give the agents "
            "`auth.heartbeat_keys`, or `server.host: 127.0.0.1`"
        )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_models(config: Config, pools: set[str]) -> None:
    names: set[str] = set()
    for i, route in enumerate(config.models):
        where = f"$.models[{i}]"
        if route.name in pools or route.name in names:
            raise ConfigError(f"{where}.name: {route.name!r} is already a pool or a model name")
        names.add(route.name)
        kinds = [k for k in (route.alias, route.split, route.tiers) if k is not None]
        if len(kinds) != 1:
            raise ConfigError(f"{where}: give exactly one of `alias`, `split` or `tiers`")
        targets: list[tuple[str, str]] = []
        if route.alias is not None:
            targets.append((f"{where}.alias", route.alias))
        if route.split is not None:
            if not route.split:
                raise ConfigError(f"{where}.split is empty: list the pools and their weights")
            for j, share in enumerate(route.split):
                if not 0 < share.weight < math.inf:
                    raise ConfigError(f"{where}.split[{j}].weight must be a number > 0")
                targets.append((f"{where}.split[{j}].model", share.model))
        if route.tiers is not None:
            if route.tiers.max_prompt_tokens < 1:
                raise ConfigError(f"{where}.tiers.max_prompt_tokens must be >= 1")
            targets += [(f"{where}.tiers.cheap", route.tiers.cheap),
                        (f"{where}.tiers.strong", route.tiers.strong)]  # fmt: skip
        for at, target in targets:
            if target not in pools:
                known = ", ".join(sorted(pools))
                raise ConfigError(f"{at}: no pool serves {target!r}; pools: {known}")


def parse_config(data: Any) -> Config:
    """Validate already-parsed YAML/JSON data."""
    if data is None:
        data = {}
    try:
        return check_config(msgspec.convert(data, Config))
    except msgspec.ValidationError as exc:
        raise ConfigError(str(exc).replace("Object contains", "Unknown key:")) from None


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return parse_config(data)


# The built-in fleet's objectives: interactive-chat figures an operator would start from.
DEFAULT_SLO = {"ttft_s": 2.0, "mean_e2e_s": 10.0, "availability": 0.99}


def default_sim_config() -> Config:
    """The built-in fleet `fleetgate serve` starts with no config: 4 simulated workers, two
    models, the 8B one on two kinds of GPU."""
    return parse_config(
        {
            "pools": [
                {
                    "model": "llama-3.1-8b-instruct",
                    "backends": [
                        {"sim": "h100-llama3-8b", "labels": {"accelerator": "H100"}},
                        {"sim": "a100-llama3-8b", "labels": {"accelerator": "A100"}},
                    ],
                    "engine_priority": True,  # its sims schedule by priority
                    "slo": DEFAULT_SLO,
                },
                {
                    "model": "llama-3.3-70b-instruct",
                    "backends": [
                        {"sim": "h100x2-llama3-70b-fp8", "labels": {"accelerator": "2xH100"}},
                        {"sim": "h100x2-llama3-70b-fp8", "labels": {"accelerator": "2xH100"}},
                    ],
                    "engine_priority": True,
                    "slo": DEFAULT_SLO,
                },
            ]
        }
    )
