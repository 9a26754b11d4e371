"""The gateway's configuration: one YAML file, validated once at start into frozen objects.

Every default is stated here, next to its field, and in docs/configuration.md. An unknown key or
a value of the wrong type is a `ConfigError` that names where it is (`$.pools[0].polcy`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from fleetgate.fleet.calibration import WeightSettings
from fleetgate.fleet.health import HealthSettings
from fleetgate.fleet.scraper import ScrapeSettings
from fleetgate.health.active import ActiveCheckSettings
from fleetgate.health.outlier import OutlierSettings
from fleetgate.http.client import Origin
from fleetgate.http.server import ServerLimits
from fleetgate.resilience.hedge import HedgeSettings
from fleetgate.resilience.retry import RetrySettings
from fleetgate.routing.pipeline import SHORTLIST
from fleetgate.routing.registry import DEFAULT_POLICY, PluginSpec, Profile
from fleetgate.upstream.timeouts import Timeouts
from fleetgate.workers.sim.profiles import PROFILES

_LIMITS = ServerLimits()
_TIMEOUTS = Timeouts()
_CHECKS = ActiveCheckSettings()
_HEALTH = HealthSettings()
_HEDGE = HedgeSettings()
_OUTLIER = OutlierSettings()
_RETRY = RetrySettings()
_SCRAPE = ScrapeSettings()
_WEIGHTS = WeightSettings()


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and says what is expected."""


class ServerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"  # address the gateway listens on
    port: int = 8080  # port the gateway listens on; 0 picks a free one
    # The HTTP limits' defaults live with the server (fleetgate/http/server.py, ServerLimits).
    max_body_bytes: int = _LIMITS.max_body_bytes  # larger request bodies get 413
    max_header_bytes: int = _LIMITS.max_header_bytes  # a larger request head gets 431
    keep_alive_timeout_s: float = _LIMITS.keep_alive_timeout_s  # idle client connections close
    request_timeout_s: float = _LIMITS.request_timeout_s  # a request must arrive within this
    connect_timeout_s: float = 5.0  # discovery and health probes connecting to a backend
    drain_timeout_s: float = 30.0  # on SIGTERM/Ctrl-C, requests in progress get this long
    admin: bool = False  # serve /admin/* (draining backends); keep off on exposed ports


class BackendConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    url: str | None = None  # an OpenAI-compatible server, e.g. http://10.0.0.5:8000
    sim: str | None = None  # or: an embedded simulated worker with this engine profile
    weight: float = 1.0  # relative share for weight-aware policies
    labels: dict[str, str] = {}  # free-form: region, zone, accelerator, tier
    max_in_flight: int | None = None  # at this many requests in flight routing skips it


class HealthCheckConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # Defaults live with the checker (fleetgate/health/active.py, ActiveCheckSettings).
    enabled: bool = _CHECKS.enabled  # probe every backend of the pool
    # GET `path`; a one-token completion; or workers push POST /fleet/heartbeat
    kind: Literal["http", "inference", "heartbeat"] = _CHECKS.kind
    path: str = _CHECKS.path  # for kind http
    interval_s: float = _CHECKS.interval_s  # between two probes of one backend
    jitter: float = _CHECKS.jitter  # intervals drawn from interval_s * (1 +- jitter)
    timeout_s: float = _CHECKS.timeout_s  # a slower probe failed
    unhealthy_threshold: int = _CHECKS.unhealthy_threshold  # failures in a row: unhealthy
    healthy_threshold: int = _CHECKS.healthy_threshold  # successes in a row: healthy again

    def settings(self) -> ActiveCheckSettings:
        return ActiveCheckSettings(**msgspec.structs.asdict(self))


class HedgeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # Defaults live with hedging (fleetgate/resilience/hedge.py, HedgeSettings).
    enabled: bool = _HEDGE.enabled  # opt-in: a hedge costs a second backend's work
    percentile: float = _HEDGE.percentile  # hedge when the first token is later than this
    min_delay_s: float = _HEDGE.min_delay_s  # never hedge sooner
    max_delay_s: float = _HEDGE.max_delay_s  # never wait longer; the delay before there is data
    window: int = _HEDGE.window  # recent TTFTs the percentile is taken over

    def settings(self) -> HedgeSettings:
        return HedgeSettings(**msgspec.structs.asdict(self))


class OutlierConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # Defaults live with the detector (fleetgate/health/outlier.py, OutlierSettings).
    consecutive_failures: int = _OUTLIER.consecutive_failures  # in a row: eject
    failure_rate: float = _OUTLIER.failure_rate  # or this share failing in an interval
    min_requests: int = _OUTLIER.min_requests  # before the failure rate counts
    interval_s: float = _OUTLIER.interval_s  # the failure rate's window
    base_ejection_s: float = _OUTLIER.base_ejection_s  # the n-th ejection lasts n times this
    max_ejection_s: float = _OUTLIER.max_ejection_s  # cap on one ejection
    max_ejected_share: float = _OUTLIER.max_ejected_share  # of a pool, at once

    def settings(self) -> OutlierSettings:
        return OutlierSettings(**msgspec.structs.asdict(self))


class RetryConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # Defaults live with the policy (fleetgate/resilience/retry.py, RetrySettings).
    max_attempts: int = _RETRY.max_attempts  # the first try included; 1: no retries
    backoff_base_s: float = _RETRY.backoff_base_s  # the first retry waits up to this
    backoff_max_s: float = _RETRY.backoff_max_s  # no retry waits longer
    budget_ratio: float = _RETRY.budget_ratio  # retries in flight <= this x requests in flight
    budget_min: int = _RETRY.budget_min  # ...but this many are always allowed

    def settings(self) -> RetrySettings:
        return RetrySettings(**msgspec.structs.asdict(self))


class EngineMetricsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # Defaults live with the scraper (fleetgate/fleet/scraper.py, ScrapeSettings).
    enabled: bool = _SCRAPE.enabled  # read each backend's engine metrics
    path: str = _SCRAPE.path  # where the engine serves them (Prometheus text)
    interval_s: float = _SCRAPE.interval_s  # between two scrapes of one backend
    jitter: float = _SCRAPE.jitter  # intervals drawn from interval_s * (1 +- jitter)
    timeout_s: float = _SCRAPE.timeout_s  # a slower scrape is abandoned
    stale_after_s: float = _SCRAPE.stale_after_s  # older readings are not trusted

    def settings(self) -> ScrapeSettings:
        return ScrapeSettings(**msgspec.structs.asdict(self))


class WeightsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # Defaults live with the calibration (fleetgate/fleet/calibration.py, WeightSettings).
    calibrate: bool = _WEIGHTS.enabled  # weights follow each backend's measured speed
    interval_s: float = _WEIGHTS.interval_s  # between two recalibrations
    min_intervals: int = _WEIGHTS.min_intervals  # scrapes with decoding before it is trusted

    def settings(self) -> WeightSettings:
        return WeightSettings(self.calibrate, self.interval_s, self.min_intervals)


class RoutingConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
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


class PrefillConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Prefill/decode disaggregation: the pool's `backends` decode, these prefill."""

    backends: list[BackendConfig]  # the prefill engines (vLLM with a KV connector, or sims)
    policy: str = DEFAULT_POLICY  # how one of them is chosen, by name as `pools[].policy`


class PoolConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    model: str  # the `model` clients send
    backends: list[BackendConfig]
    policy: str = DEFAULT_POLICY  # a routing policy or profile by name (docs/configuration.md)
    policy_params: dict[str, Any] = {}  # parameters of that policy, if it has any
    routing: RoutingConfig | None = None  # or a composed profile (then leave `policy` out)
    # How long to wait on a backend; the defaults live with fleetgate/fleet/pool.py, Timeouts.
    first_byte_timeout_s: float = _TIMEOUTS.first_byte_s  # until the answer's head, or 504
    total_timeout_s: float = _TIMEOUTS.total_s  # the whole answer, stream included, or 504
    idle_timeout_s: float = _TIMEOUTS.idle_s  # longest silence between stream chunks
    connect_timeout_s: float = _TIMEOUTS.connect_s  # opening a connection for a request
    health_check: HealthCheckConfig = HealthCheckConfig()
    hedge: HedgeConfig = HedgeConfig()  # hedged streams (off unless enabled)
    outlier: OutlierConfig = OutlierConfig()  # ejection on failures seen in traffic
    retries: RetryConfig = RetryConfig()  # trying another backend before the first byte
    engine_metrics: EngineMetricsConfig = EngineMetricsConfig()  # backends' own load
    weights: WeightsConfig = WeightsConfig()  # self-calibrating weights
    prefill: PrefillConfig | None = None  # disaggregated: prefill here, decode on `backends`
    # Below this share of healthy backends, route across all (fleetgate/fleet/health.py).
    panic_threshold: float = _HEALTH.panic_threshold
    slow_start_s: float = _HEALTH.slow_start_s  # a returning backend ramps up over this


class ShareConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    model: str  # a pool's model
    weight: float  # its relative share of the split, > 0


class TiersConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    cheap: str  # the pool requests go to unless they are hard
    strong: str  # the pool hard requests go to
    max_prompt_tokens: int = 2048  # a prompt this long (estimated) is hard
    keywords: list[str] = []  # a prompt containing one of these (any case) is hard


class ModelRouteConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A model name clients may send that is not a pool (docs/configuration.md, "Models")."""

    name: str  # what clients send
    alias: str | None = None  # another name for this pool
    split: list[ShareConfig] | None = None  # or: weighted shares between pools
    tiers: TiersConfig | None = None  # or: a cheap pool unless the request is hard


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    server: ServerConfig = ServerConfig()
    pools: list[PoolConfig] = []
    models: list[ModelRouteConfig] = []  # aliases, splits and tiers over the pools
    seed: int | None = None  # seeds routing's random choices; None draws one at start


def check_config(config: Config) -> Config:
    """Rules across fields that types alone cannot state; raises ConfigError."""
    if not config.pools:
        raise ConfigError("`pools` is empty: configure at least one pool with backends")
    seen: set[str] = set()
    for i, pool in enumerate(config.pools):
        where = f"$.pools[{i}]"
        if pool.model in seen:
            raise ConfigError(f"{where}.model: {pool.model!r} has two pools; merge them")
        seen.add(pool.model)
        if pool.routing is not None:
            if pool.policy != DEFAULT_POLICY or pool.policy_params:
                raise ConfigError(f"{where}: give `policy` or `routing`, not both")
            pool.routing.profile(f"{where}.routing")
        check = pool.health_check
        for at, value in (
            (f"{where}.first_byte_timeout_s", pool.first_byte_timeout_s),
            (f"{where}.total_timeout_s", pool.total_timeout_s),
            (f"{where}.idle_timeout_s", pool.idle_timeout_s),
            (f"{where}.connect_timeout_s", pool.connect_timeout_s),
            (f"{where}.health_check.interval_s", check.interval_s),
            (f"{where}.health_check.timeout_s", check.timeout_s),
        ):
            if not 0 < value < math.inf:
                raise ConfigError(f"{at} must be a finite number of seconds > 0")
        hedge = pool.hedge
        if not (0 < hedge.percentile <= 1 and 0 < hedge.min_delay_s <= hedge.max_delay_s
                and hedge.window >= 1):  # fmt: skip
            raise ConfigError(f"{where}.hedge: need 0 < percentile <= 1, "
                              "0 < min_delay_s <= max_delay_s and window >= 1")  # fmt: skip
        m = pool.engine_metrics
        if not (0 < m.interval_s < math.inf and m.timeout_s > 0 and m.stale_after_s > 0
                and 0 <= m.jitter < 1):  # fmt: skip
            raise ConfigError(f"{where}.engine_metrics: times must be > 0, jitter in [0, 1)")
        if not 0 < pool.weights.interval_s < math.inf or pool.weights.min_intervals < 1:
            raise ConfigError(f"{where}.weights: need interval_s > 0 and min_intervals >= 1")
        o, r = pool.outlier, pool.retries
        if min(o.consecutive_failures, o.min_requests, r.max_attempts) < 1 or not (
            0 < o.failure_rate <= 1 and o.interval_s > 0
            and 0 < o.base_ejection_s <= o.max_ejection_s
            and 0 <= o.max_ejected_share <= 1 and 0 <= r.backoff_base_s <= r.backoff_max_s
            and r.budget_ratio >= 0 and r.budget_min >= 0
        ):  # fmt: skip
            raise ConfigError(
                f"{where}.outlier/retries: counts must be >= 1, shares in [0, 1], "
                "times > 0 with base <= max (see docs/configuration.md)"
            )
        if not 0 <= check.jitter < 1 or not 0 <= pool.panic_threshold <= 1:
            raise ConfigError(f"{where}: jitter must be in [0, 1) and panic_threshold in [0, 1]")
        if min(check.unhealthy_threshold, check.healthy_threshold) < 1 or pool.slow_start_s < 0:
            raise ConfigError(f"{where}: health thresholds must be >= 1, slow_start_s >= 0")
        if not pool.backends:
            raise ConfigError(f"{where}.backends is empty: give the pool at least one backend")
        if pool.prefill is not None and not pool.prefill.backends:
            raise ConfigError(f"{where}.prefill.backends is empty: give at least one")
        prefill = pool.prefill.backends if pool.prefill is not None else []
        listed = [(f"{where}.backends[{j}]", b) for j, b in enumerate(pool.backends)]
        listed += [(f"{where}.prefill.backends[{j}]", b) for j, b in enumerate(prefill)]
        for at, backend in listed:
            if (backend.url is None) == (backend.sim is None):
                raise ConfigError(f"{at}: give exactly one of `url` or `sim`")
            if not 0 < backend.weight < math.inf:  # also rejects NaN
                raise ConfigError(f"{at}.weight must be a finite number > 0, got {backend.weight}")
            if backend.max_in_flight is not None and backend.max_in_flight < 1:
                raise ConfigError(f"{at}.max_in_flight must be >= 1 (or absent: no limit)")
            if backend.url is not None:
                try:
                    Origin.parse(backend.url)
                except ValueError as exc:
                    raise ConfigError(f"{at}.url: {exc}") from None
            if backend.sim is not None and backend.sim not in PROFILES:
                known = ", ".join(sorted(PROFILES))
                raise ConfigError(f"{at}.sim: no profile {backend.sim!r}; known: {known}")
    _check_models(config, seen)
    if not 0 <= config.server.port < 65536:
        raise ConfigError(f"$.server.port must be in 0..65535, got {config.server.port}")
    if config.server.max_body_bytes <= 0:
        raise ConfigError("$.server.max_body_bytes must be > 0")
    server = config.server
    for name in ("connect_timeout_s", "keep_alive_timeout_s", "request_timeout_s",
                 "drain_timeout_s"):  # fmt: skip
        if not 0 < getattr(server, name) < math.inf:
            raise ConfigError(f"$.server.{name} must be a finite number of seconds > 0")
    if server.max_header_bytes <= 0:
        raise ConfigError("$.server.max_header_bytes must be > 0")
    return config


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
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return parse_config(data)


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
                },
                {
                    "model": "llama-3.3-70b-instruct",
                    "backends": [
                        {"sim": "h100x2-llama3-70b-fp8", "labels": {"accelerator": "2xH100"}},
                        {"sim": "h100x2-llama3-70b-fp8", "labels": {"accelerator": "2xH100"}},
                    ],
                },
            ]
        }
    )
