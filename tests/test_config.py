"""Config: validated once into frozen objects; every mistake names where it is and what to do."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fleetgate.config import (
    BackendConfig,
    Config,
    ConfigError,
    ServerConfig,
    default_sim_config,
    load_config,
    parse_config,
)
from fleetgate.discovery.settings import (
    DnsDiscovery,
    FileDiscovery,
    KubernetesDiscovery,
    RedisDiscovery,
)
from fleetgate.kv_events.settings import KvEventsConfig


def one_pool(**backend: Any) -> dict[str, Any]:
    return {"pools": [{"model": "m", "backends": [backend or {"url": "http://10.0.0.5:8000"}]}]}


def test_defaults_fill_everything_but_the_pools() -> None:
    config = parse_config(one_pool())
    assert config.server == ServerConfig(
        host="127.0.0.1", port=8080, max_body_bytes=4 * 1024 * 1024, connect_timeout_s=5.0
    )
    assert config.seed is None
    (pool,) = config.pools
    assert (pool.model, pool.policy, pool.policy_params) == ("m", "balanced", {})
    assert pool.backends == [
        BackendConfig(url="http://10.0.0.5:8000", sim=None, weight=1.0, labels={})
    ]


def test_a_full_config_is_read_as_written() -> None:
    config = parse_config(
        {
            "server": {"host": "0.0.0.0", "port": 0, "max_body_bytes": 1024},
            "seed": 7,
            "pools": [
                {
                    "model": "m",
                    "policy": "power_of_two",
                    "backends": [
                        {"url": "http://a:1", "weight": 3, "labels": {"zone": "z1"}},
                        {"sim": "h100-llama3-8b"},
                    ],
                }
            ],
        }
    )
    assert (config.server.host, config.server.port, config.server.max_body_bytes) == (
        "0.0.0.0",
        0,
        1024,
    )
    assert config.seed == 7
    first, second = config.pools[0].backends
    assert (first.weight, first.labels) == (3.0, {"zone": "z1"})
    assert (second.url, second.sim) == (None, "h100-llama3-8b")


def test_the_config_is_frozen() -> None:
    config = parse_config(one_pool())
    with pytest.raises(AttributeError):
        config.seed = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "key", "where"),
    [
        ({**one_pool(), "sever": {}}, "`sever`", None),
        ({**one_pool(), "server": {"prot": 1}}, "`prot`", "`$.server`"),
        (
            {"pools": [{"model": "m", "polcy": "random", "backends": [{"url": "http://a"}]}]},
            "`polcy`",
            "`$.pools[0]`",
        ),
        (one_pool(url="http://a", wieght=2), "`wieght`", "`$.pools[0].backends[0]`"),
    ],
)
def test_an_unknown_key_is_named_with_its_path(
    data: dict[str, Any], key: str, where: str | None
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    message = str(info.value)
    assert message.startswith("Unknown key:")
    assert key in message
    if where is not None:
        assert f"at {where}" in message


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {**one_pool(), "server": {"port": "80"}},
            "Expected `int`, got `str` - at `$.server.port`",
        ),
        (one_pool(url="http://a", weight="x"), "got `str` - at `$.pools[0].backends[0].weight`"),
        (one_pool(url="http://a", labels={"zone": 1}), "at `$.pools[0].backends[0].labels[...]`"),
        ({**one_pool(), "seed": True}, "Expected `int | null`, got `bool` - at `$.seed`"),
        ({"pools": {"model": "m"}}, "Expected `array`, got `object` - at `$.pools`"),
        ({"pools": [{"backends": []}]}, "missing required field `model` - at `$.pools[0]`"),
        ([1], "Expected `object`, got `array`"),
    ],
)
def test_a_wrong_type_names_the_path_and_the_expected_type(data: Any, expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        parse_config(data)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (None, "`pools` is empty: configure at least one pool"),
        ({}, "`pools` is empty"),
        (
            one_pool(url="http://a", sim="h100"),
            "give exactly one of `url` or `sim` - at `$.pools[0].backends[0]`",
        ),
        (one_pool(labels={}), "give exactly one of `url` or `sim` - at `$.pools[0].backends[0]`"),
        (one_pool(url="http://a", weight=0), "`weight` must be a finite number > 0, got 0"),
        (one_pool(url="http://a", weight=-2), "`weight` must be a finite number > 0, got -2"),
        (one_pool(url="http://a", max_in_flight=0), "`max_in_flight` must be >= 1"),
        (one_pool(url="ftp://a"), "`url`: not an http(s) URL: 'ftp://a'"),
        (one_pool(sim="b200"), "`sim`: no profile 'b200'; known: "),
        (
            {"pools": [{"model": "m", "backends": []}]},
            "$.pools[0].backends is empty: give the pool at least one backend, `discovery:`",
        ),
        (
            {
                "pools": [
                    {"model": "m", "backends": [{"url": "http://a"}]},
                    {"model": "m", "backends": [{"url": "http://b"}]},
                ]
            },
            "$.pools[1].model: 'm' has two pools; merge them",
        ),
        (
            {**one_pool(), "server": {"port": 65536}},
            "`port` must be in [0, 65535], got 65536 - at `$.server`",
        ),
        ({**one_pool(), "server": {"port": -1}}, "`port` must be in [0, 65535]"),
        (
            {**one_pool(), "server": {"max_body_bytes": 0}},
            "`max_body_bytes` must be >= 1, got 0 - at `$.server`",
        ),
        (
            {**one_pool(), "server": {"drain_timeout_s": float("inf")}},
            "`drain_timeout_s` must be a finite number of seconds > 0",
        ),
        ({**one_pool(), "limits": {"store": "redis"}}, "`store: redis` needs `redis_url`"),
        *(
            ({**one_pool(), "limits": {"store": "redis", "redis_url": url}}, expected)
            for url, expected in (
                ("http://cache:6379", "$.limits.redis_url: give redis://host:port/db"),
                ("localhost:6379", "$.limits.redis_url: give redis://host:port/db"),
                ("redis://cache:99999", "$.limits.redis_url: give a host, and a port in 1-65535"),
                ("redis://:secret@/0", "$.limits.redis_url: give a host"),
                ("redis://cache:6379/zero", "$.limits.redis_url: the path is the database's"),
                ("unix://", "$.limits.redis_url: a unix:// URL needs the socket's path"),
            )
        ),
        ({**one_pool(), "state": {"url": "http://cache:6379"}}, "$.state.url: give redis://"),
        ({**one_pool(), "cache": {"ttl_s": 0}}, "`ttl_s` must be a finite number of seconds > 0"),
        (
            {**one_pool(), "cache": {"store": "disk"}},
            "Invalid enum value 'disk' - at `$.cache.store`",
        ),
        (
            {**one_pool(), "cache": {"enabled": True, "store": "redis"}},
            "$.cache.store: redis keeps answers in the Redis of `state.url`; set it",
        ),
        (
            {**one_pool(), "state": {"load_sync_s": 0.5, "ttl_s": 1.0}},
            "`ttl_s` (1) must be at least 4 x `load_sync_s` (0.5)",
        ),
        (
            {**one_pool(), "server": {"admin": True, "host": "0.0.0.0"}},
            "$.server.admin: with auth off the admin API listens only on a loopback address",
        ),
        (
            {
                "pools": [
                    {"model": "m", "backends": [{"url": "http://a"}], "gpu": {"enabled": True}}
                ],
                "server": {"host": "0.0.0.0"},
            },
            "$.pools[0].gpu.enabled: with auth off GPU readings are taken only on a loopback",
        ),
        *(
            (
                {**one_pool(), "server": {"passthrough_paths": [path]}},
                f"`passthrough_paths`: {path!r} is not a path a backend serves apart from the "
                "gateway's own",
            )
            for path in (
                "/v1/chat/completions",
                "/admin/backends",
                "v1/rerank",
                "/v1/rerank?x=1",
                "/dashboard/events",
                "/v1/a b",
            )
        ),
    ],
)
def test_values_that_cannot_work_are_rejected_with_what_to_do(data: Any, expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        parse_config(data)


def test_the_admin_api_without_auth_is_allowed_on_loopback_only() -> None:
    for host in ("127.0.0.1", "::1", "localhost"):
        assert parse_config({**one_pool(), "server": {"admin": True, "host": host}})
    keyed = {**one_pool(), "server": {"admin": True, "host": "0.0.0.0"},
             "tenants": [{"name": "t", "keys": ["sk-config-test-key"]}]}  # fmt: skip
    assert parse_config(keyed).auth_enabled


@pytest.mark.parametrize(
    "url",
    ["redis://cache", "redis://:secret@10.0.0.9:6380/2", "rediss://cache:6379/0",
     "unix:///run/redis.sock"],
)  # fmt: skip
def test_a_redis_store_takes_the_urls_its_client_takes(url: str) -> None:
    config = parse_config({**one_pool(), "limits": {"store": "redis", "redis_url": url}})
    assert config.limits.redis_url == url


def test_a_bad_redis_url_is_refused_without_repeating_its_password() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            {**one_pool(), "limits": {"store": "redis", "redis_url": "redis://:hunter2@h:0"}}
        )
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("weight", [float("nan"), float("inf")])
def test_a_weight_that_is_not_a_finite_number_is_rejected(weight: float) -> None:
    with pytest.raises(ConfigError, match=r"weight"):
        parse_config(one_pool(url="http://a", weight=weight))


def test_load_config_reads_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "fleetgate.yaml"
    path.write_text(
        "server:\n"
        "  port: 9000\n"
        "seed: 42\n"
        "pools:\n"
        "  - model: llama\n"
        "    policy: round_robin\n"
        "    backends:\n"
        "      - url: http://10.0.0.5:8000\n"
        "        weight: 2\n"
        "        labels: {zone: a}\n"
        "      - sim: h100-llama3-8b\n"
    )
    config = load_config(path)
    assert isinstance(config, Config)
    assert (config.server.port, config.seed) == (9000, 42)
    assert config.pools[0].policy == "round_robin"
    assert [b.weight for b in config.pools[0].backends] == [2.0, 1.0]
    assert load_config(str(path)) == config


def test_load_config_rejects_invalid_yaml_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("pools:\n  - model: m\n   backends: [\n")
    with pytest.raises(ConfigError, match=f"{re.escape(str(path))} is not valid YAML"):
        load_config(path)


def test_load_config_of_a_missing_file_says_it_cannot_read_it(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match=f"cannot read config {re.escape(str(path))}"):
        load_config(path)


def test_load_config_validates_the_file(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(
        "pools:\n  - model: m\n    backends:\n      - url: http://a\n        wieght: 2\n"
    )
    with pytest.raises(ConfigError, match="`wieght`"):
        load_config(path)


def test_the_built_in_sim_fleet_is_a_valid_config() -> None:
    config = default_sim_config()
    assert [p.model for p in config.pools] == ["llama-3.1-8b-instruct", "llama-3.3-70b-instruct"]
    assert all(b.sim is not None and b.url is None for p in config.pools for b in p.backends)
    # It survives a round trip through the same validation a user's file gets.
    assert parse_config(msgspec.to_builtins(config)) == config


def test_every_key_and_default_is_in_the_configuration_doc() -> None:
    from pathlib import Path

    import msgspec

    from fleetgate.autoscale.kubernetes import KubernetesActuatorSettings
    from fleetgate.autoscale.local import LocalActuatorSettings
    from fleetgate.autoscale.recommender import AutoscaleSettings
    from fleetgate.autoscale.schedule import PeakSettings
    from fleetgate.batches.settings import BatchesSettings
    from fleetgate.config import (
        AuthConfig,
        BackendConfig,
        LimitsConfig,
        ModelRouteConfig,
        PoolConfig,
        PrefillConfig,
        RoutingConfig,
        ServerConfig,
        ShareConfig,
        TiersConfig,
    )
    from fleetgate.fleet.calibration import WeightSettings
    from fleetgate.fleet.scraper import ScrapeSettings
    from fleetgate.health.active import ActiveCheckSettings
    from fleetgate.health.gpu import GpuSettings
    from fleetgate.health.outlier import OutlierSettings
    from fleetgate.observe.request_log import RequestLogSettings
    from fleetgate.observe.slo import SloSettings
    from fleetgate.observe.tracing import TracingSettings
    from fleetgate.resilience.hedge import HedgeSettings
    from fleetgate.resilience.retry import RetrySettings
    from fleetgate.traffic.admission import AdmissionSettings
    from fleetgate.traffic.batch_lane import BatchLaneSettings
    from fleetgate.traffic.concurrency import LimitSettings
    from fleetgate.traffic.limits import PricingSettings
    from fleetgate.traffic.tenants import BudgetSettings, RateLimitSettings, TenantSettings

    doc = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text()
    for prefix, struct in (("server.", ServerConfig), ("pools[].", PoolConfig),
                           ("backends[].", BackendConfig),
                           ("backends[].kv_events.", KvEventsConfig),
                           ("pools[].health_check.", ActiveCheckSettings),
                           ("pools[].hedge.", HedgeSettings),
                           ("pools[].outlier.", OutlierSettings),
                           ("pools[].gpu.", GpuSettings),
                           ("pools[].retries.", RetrySettings),
                           ("pools[].engine_metrics.", ScrapeSettings),
                           ("pools[].routing.", RoutingConfig), ("models[].", ModelRouteConfig),
                           ("models[].split[].", ShareConfig),
                           ("models[].tiers.", TiersConfig),
                           ("pools[].weights.", WeightSettings),
                           ("pools[].prefill.", PrefillConfig),
                           ("pools[].pricing.", PricingSettings), ("auth.", AuthConfig),
                           ("tenants[].", TenantSettings),
                           ("tenants[].limits.", RateLimitSettings),
                           ("tenants[].budget.", BudgetSettings),
                           ("limits.", LimitsConfig),
                           ("pools[].admission.", AdmissionSettings),
                           ("pools[].admission.limit.", LimitSettings),
                           ("pools[].admission.batch_lane.", BatchLaneSettings),
                           ("request_log.", RequestLogSettings),
                           ("pools[].slo.", SloSettings),
                           ("pools[].autoscale.", AutoscaleSettings),
                           ("pools[].autoscale.schedule[].", PeakSettings),
                           ("pools[].autoscale.local.", LocalActuatorSettings),
                           ("pools[].autoscale.kubernetes.", KubernetesActuatorSettings),
                           ("tracing.", TracingSettings),
                           ("batches.", BatchesSettings),
                           ("discovery[].", FileDiscovery),
                           ("discovery[].", RedisDiscovery),
                           ("discovery[].", DnsDiscovery),
                           ("discovery[].", KubernetesDiscovery)):  # fmt: skip
        for field in msgspec.structs.fields(struct):
            assert f"`{prefix}{field.name}`" in doc, f"{prefix}{field.name} is not documented"
            if prefix == "server.":
                row = next(line for line in doc.splitlines() if f"`{prefix}{field.name}`" in line)
                default = field.default
                parts = default if isinstance(default, tuple) else (default,)
                for part in parts:  # each of a list's items; None is YAML's null
                    text = "null" if part is None else str(part).rstrip("0").rstrip(".")
                    assert text in row.replace(",", "")


def routed(routing: Any, **pool: Any) -> dict[str, Any]:
    data = one_pool()
    data["pools"][0].update(routing=routing, **pool)
    return data


def test_a_composed_routing_section_becomes_a_profile_of_weighted_plugins() -> None:
    routing = {
        "filters": [{"type": "length_split", "threshold_tokens": 2000}],
        "scorers": [
            {"type": "prefix_cache", "weight": 3, "memory_mb": 8},
            {"type": "queue", "weight": 2},
        ],
        "shortlist": 8,
    }  # fmt: skip
    pool = parse_config(routed(routing)).pools[0]
    assert pool.routing is not None
    profile = pool.routing.profile("$")
    assert [(spec.type, dict(spec.params), w) for spec, w in profile.scorers] == [
        ("prefix_cache", {"memory_mb": 8}, 3.0), ("queue", {}, 2.0)
    ]  # fmt: skip
    assert [(f.type, dict(f.params)) for f in profile.filters] == [
        ("length_split", {"threshold_tokens": 2000})
    ]
    assert (profile.picker, profile.shortlist) == ("max_score", 8)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (routed({"scorers": [{"type": "queue"}]}), "$.pools[0].routing.scorers[0].weight"),
        (routed({"scorers": [{"type": "queue", "weight": 0}]}), "scorers[0].weight: give"),
        (routed({"scorers": [{"weight": 1}]}), "$.pools[0].routing.scorers[0].type"),
        (routed({"scorers": []}), "$.pools[0].routing.scorers is empty"),
        (routed({"scorers": [{"type": "queue", "weight": 1}]}, policy="random"), "not both"),
        (routed({"scorers": [{"type": "queue", "weight": 1}], "shortlist": 0}), "shortlist"),
    ],
)
def test_a_malformed_routing_section_names_the_entry(data: Any, expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        parse_config(data)


def two_pools(*models: dict[str, Any]) -> dict[str, Any]:
    backends = [{"url": "http://10.0.0.5:8000"}]
    return {
        "pools": [{"model": "a", "backends": backends}, {"model": "b", "backends": backends}],
        "models": list(models),
    }


def test_model_names_route_to_pools_by_alias_split_or_tiers() -> None:
    config = parse_config(two_pools(
        {"name": "gpt", "alias": "a"},
        {"name": "canary", "split": [{"model": "a", "weight": 9}, {"model": "b", "weight": 1}]},
        {"name": "auto", "tiers": {"cheap": "a", "strong": "b", "keywords": ["prove"]}},
    ))  # fmt: skip
    assert [m.name for m in config.models] == ["gpt", "canary", "auto"]
    tiers = config.models[2].tiers
    assert tiers is not None and tiers.max_prompt_tokens == 2048


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        ({"name": "a", "alias": "b"}, "$.models[0].name: 'a' is already a pool"),
        ({"name": "x"}, "$.models[0]: give exactly one of `alias`, `split` or `tiers`"),
        ({"name": "x", "alias": "a", "tiers": {"cheap": "a", "strong": "b"}}, "exactly one"),
        ({"name": "x", "alias": "c"}, "$.models[0].alias: no pool serves 'c'; pools: a, b"),
        ({"name": "x", "split": []}, "$.models[0].split is empty"),
        ({"name": "x", "split": [{"model": "a", "weight": 0}]}, "split[0].weight must be"),
        ({"name": "x", "tiers": {"cheap": "a", "strong": "z"}}, "tiers.strong: no pool"),
    ],
)  # fmt: skip
def test_a_bad_model_route_names_where_it_is(route: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        parse_config(two_pools(route))


def pool_with(**fields: Any) -> dict[str, Any]:
    data = one_pool()
    data["pools"][0].update(fields)
    return data


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"hedge": {"percentile": 0}},
         "`percentile` must be in (0, 1], got 0.0 - at `$.pools[0].hedge`"),
        ({"hedge": {"min_delay_s": 2, "max_delay_s": 1}},
         "`min_delay_s` (2.0) must not exceed `max_delay_s` (1.0)"),
        ({"hedge": {"window": 0}}, "`window` must be >= 1, got 0"),
        ({"outlier": {"failure_rate": 1.5}},
         "`failure_rate` must be in (0, 1], got 1.5 - at `$.pools[0].outlier`"),
        ({"outlier": {"base_ejection_s": 0}},
         "`base_ejection_s` must be a finite number of seconds > 0"),
        ({"outlier": {"max_ejected_share": -0.1}}, "`max_ejected_share` must be in [0, 1]"),
        ({"retries": {"max_attempts": 0}},
         "`max_attempts` must be >= 1, got 0 - at `$.pools[0].retries`"),
        ({"retries": {"backoff_base_s": 1, "backoff_max_s": 0.5}},
         "`backoff_base_s` (1.0) must not exceed `backoff_max_s` (0.5)"),
        ({"health_check": {"jitter": 1}},
         "`jitter` must be in [0, 1), got 1.0 - at `$.pools[0].health_check`"),
        ({"health_check": {"healthy_threshold": 0}}, "`healthy_threshold` must be >= 1"),
        ({"health_check": {"timeout": 2}},
         "Unknown key: unknown field `timeout` - at `$.pools[0].health_check`"),
        ({"engine_metrics": {"interval_s": 0}},
         "`interval_s` must be a finite number of seconds > 0, got 0.0 - at `$.pools[0].engine_"),
        ({"weights": {"min_intervals": 0}},
         "`min_intervals` must be >= 1, got 0 - at `$.pools[0].weights`"),
        ({"weights": {"max_error": 0}},
         "`max_error` must be in (0, 1], got 0.0 - at `$.pools[0].weights`"),
        ({"total_timeout_s": float("nan")},
         "`total_timeout_s` must be a finite number of seconds > 0, got nan - at `$.pools[0]`"),
        ({"panic_threshold": 2}, "`panic_threshold` must be in [0, 1], got 2.0"),
        ({"slow_start_s": -1}, "`slow_start_s` must be >= 0"),
        ({"policy": "round_robin", "routing": {"scorers": [{"type": "queue", "weight": 1}]}},
         "give `policy` or `routing`, not both - at `$.pools[0]`"),
        ({"prefill": {"backends": []}},
         "`backends` is empty: give at least one - at `$.pools[0].prefill`"),
    ],
)  # fmt: skip
def test_each_section_checks_its_own_fields_and_says_where(
    fields: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        parse_config(pool_with(**fields))


def test_a_section_is_the_settings_object_of_the_part_it_configures() -> None:
    from fleetgate.health.outlier import OutlierSettings
    from fleetgate.resilience.retry import RetrySettings

    pool = parse_config(pool_with(retries={"max_attempts": 5}, outlier={})).pools[0]
    assert pool.retries == RetrySettings(max_attempts=5)
    assert pool.outlier == OutlierSettings()
    with pytest.raises(ValueError, match="`max_attempts` must be >= 1"):
        RetrySettings(max_attempts=0)  # the same check when code builds one


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        ({"url": "http://a", "kv_events": {}}, "`kv_events.endpoint`: give the engine's"),
        ({"sim": "h100-llama3-8b", "kv_events": {"endpoint": "tcp://a:1"}}, "or none for a"),
        ({"url": "http://a", "kv_events": {"endpoint": "http://a:5557"}}, "tcp://HOST:PORT"),
        ({"url": "http://a", "kv_events": {"endpoint": "tcp://a:1; rm"}}, "tcp://HOST:PORT"),
        ({"sim": "h100-llama3-8b", "kv_events": {"encoding": "json"}}, "one of array, map"),
        ({"sim": "h100-llama3-8b", "kv_events": {"topic": "a\nb"}}, "`topic` must be"),
        ({"sim": "h100-llama3-8b", "kv_events": {"replay_timeout_s": 0}}, "replay_timeout_s"),
    ],
)
def test_bad_kv_events_settings_are_refused(backend: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        parse_config({"pools": [{"model": "m", "backends": [backend]}]})


def test_kv_events_settings_that_are_right() -> None:
    config = parse_config({"pools": [{"model": "m", "backends": [
        {"url": "http://a", "kv_events": {"endpoint": "tcp://10.0.0.5:5557",
                                          "replay_endpoint": "tcp://[::1]:5558"}},
        {"sim": "h100-llama3-8b", "kv_events": {"encoding": "array"}},
    ]}]})  # fmt: skip
    events = config.pools[0].backends[0].kv_events
    assert events is not None
    assert events.replay_endpoint == "tcp://[::1]:5558"


@pytest.mark.parametrize(
    ("discovery", "expected"),
    [
        ({"type": "consul", "name": "x"}, "Invalid value 'consul' - at `$.discovery[0].type`"),
        ({"type": "dns", "name": "x"}, "missing required field `model` - at `$.discovery[0]`"),
        ({"type": "file"}, "missing required field `path` - at `$.discovery[0]`"),
        ({"type": "file", "path": "b.yaml", "interval_s": 0}, "`interval_s` must be"),
        ({"type": "redis", "url": "http://x:1"}, "$.discovery[0].url: give redis://"),
        ({"type": "redis", "url": "redis://x:1", "key_prefix": ""}, "`key_prefix` must be"),
    ],
)
def test_a_discovery_source_it_cannot_use_is_refused(
    discovery: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        parse_config({**one_pool(url="http://a"), "discovery": [discovery]})


def test_a_pool_may_list_no_backends_when_discovery_finds_them() -> None:
    config = parse_config({"pools": [{"model": "m", "backends": []}],
                           "discovery": [{"type": "file", "path": "b.yaml"}]})  # fmt: skip
    assert config.pools[0].backends == []


def test_the_environment_says_where_the_gateway_runs_unless_the_config_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fleetgate.cli import _command_line, build_parser

    args = build_parser().parse_args(["serve"])
    monkeypatch.setenv("FLEETGATE_REGION", "eu-west")
    monkeypatch.setenv("FLEETGATE_ZONE", "eu-west-1b")
    server = _command_line(parse_config(one_pool(url="http://a")), args).server
    assert (server.region, server.zone) == ("eu-west", "eu-west-1b")
    placed = parse_config({**one_pool(url="http://a"), "server": {"region": "us-east"}})
    assert _command_line(placed, args).server.region == "us-east"  # the config's wins
