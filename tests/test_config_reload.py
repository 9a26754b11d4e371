"""Reloading a running gateway's config (fleetgate/reload.py), in-process over real sockets:
what carries over, what is refused, and that the refused leave everything as it was."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from fleetgate.config import Config, ConfigError, parse_config
from fleetgate.fleet.health import HealthFlag
from fleetgate.reload import ConfigSource, Keeper, check_posted, restart_only_changes
from fleetgate.running import RunningGateway, start_gateway

A, B, C = "http://127.0.0.1:9", "http://127.0.0.2:9", "http://127.0.0.3:9"  # never answer
OFF = {"enabled": False}


def config(backends: list[str], **extra: Any) -> Config:
    pool = {"model": "m", "backends": [{"url": u} for u in backends],
            "health_check": OFF, "engine_metrics": OFF, **extra.pop("pool", {})}  # fmt: skip
    return parse_config({"server": {"port": 0}, "request_log": OFF, "pools": [pool], **extra})


@pytest.fixture
async def running() -> AsyncIterator[RunningGateway]:
    gateway = await start_gateway(config([A, B]))
    try:
        yield gateway
    finally:
        await gateway.close()


async def reload(running: RunningGateway, new: Config) -> None:
    async def read() -> Config:
        return new

    await running.reload(read, "signal")


async def test_a_pool_kept_keeps_what_it_learned_and_follows_its_backends(
    running: RunningGateway,
) -> None:
    pool = running.pools["m"]
    a, b = pool.members["127.0.0.1:9"], pool.members["127.0.0.2:9"]
    a.speed = 0.5  # as if calibrated
    await reload(running, config([A, C], pool={"policy": "round_robin"}))
    assert running.pools["m"] is pool  # the same pool, its members' states the same
    assert pool.members["127.0.0.1:9"] is a and a.speed == 0.5
    assert "127.0.0.2:9" not in pool.members and b.flags & HealthFlag.GONE  # drained, left
    c = pool.members["127.0.0.3:9"]
    assert c.ramp_from is not None and not c.flags  # routable at once, at a slow start
    assert running.gateway.clusters["m"].router.pipeline is not None
    assert running.config.pools[0].policy == "round_robin"


async def test_a_configured_weight_follows_and_the_effective_weight_keeps_its_share(
    running: RunningGateway,
) -> None:
    a = running.pools["m"].members["127.0.0.1:9"]
    a.speed, a.weight = 0.5, 0.5
    new = config([A, B])
    pools = [msgspec.structs.replace(new.pools[0], backends=[
        msgspec.structs.replace(new.pools[0].backends[0], weight=4.0), new.pools[0].backends[1]
    ])]  # fmt: skip
    await reload(running, msgspec.structs.replace(new, pools=pools))
    assert a.backend.weight == 4.0 and a.weight == 2.0


async def test_a_broken_config_changes_nothing(running: RunningGateway) -> None:
    gateway, pool = running.gateway, running.pools["m"]
    members = dict(pool.members)
    bad = config([C], pool={"routing": {"scorers": [{"type": "no_such_scorer", "weight": 1}]}})
    with pytest.raises(ConfigError, match="no_such_scorer"):
        await reload(running, bad)
    assert running.gateway is gateway and pool.members == members
    assert not any(s.flags for s in members.values())
    status = running.gateway.clusters["m"].pool
    assert status is pool


async def test_admission_is_kept_while_its_settings_are(running: RunningGateway) -> None:
    admission = running.gateway.clusters["m"].admission
    assert admission is not None
    await reload(running, config([A, B], pool={"policy": "round_robin"}))
    assert running.gateway.clusters["m"].admission is admission  # its queue and limit go on
    await reload(running, config([A, B], pool={"admission": {"max_queue": 100}}))
    assert running.gateway.clusters["m"].admission is not admission


def status_of(port: int, key: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/models", headers={"authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_a_key_removed_by_a_reload_is_refused_from_the_next_request() -> None:
    def keyed(keys: list[str]) -> Config:
        return config([A], tenants=[{"name": "t", "keys": keys}])

    running = await start_gateway(keyed(["sk-reload-old-key", "sk-reload-kept-key"]))
    try:
        port = running.port
        assert await asyncio.to_thread(status_of, port, "sk-reload-old-key") == 200
        await reload(running, keyed(["sk-reload-kept-key"]))
        assert await asyncio.to_thread(status_of, port, "sk-reload-old-key") == 401
        assert await asyncio.to_thread(status_of, port, "sk-reload-kept-key") == 200
    finally:
        await running.close()


def test_what_only_a_restart_applies_is_named() -> None:
    old = config([A])
    new = parse_config({
        "server": {"port": 8081, "metrics": False},
        "limits": {"store": "redis", "redis_url": "redis://127.0.0.1:6379/0"},
        "state": {"url": "redis://127.0.0.1:6379/0"},
        "pools": [{"model": "m", "backends": [{"url": A}, {"sim": "h100-llama3-8b"}]}],
    })  # fmt: skip
    changed = restart_only_changes(old, new)
    assert changed == ["server.port", "limits.store", "limits.redis_url", "state",
                       "the pools' `sim:` backends"]  # fmt: skip
    assert restart_only_changes(old, config([B, C], pool={"policy": "round_robin"})) == []


def test_a_posted_config_may_not_choose_the_gateways_files() -> None:
    old = config([A])
    check_posted(old, config([B]))
    for files in ({"request_log": {"path": "/tmp/x.log"}}, {"auth": {"key_file": "/etc/keys"}},
                  {"server": {"port": 0, "audit_log": "/tmp/audit"}}):  # fmt: skip
        data = json.loads(msgspec.json.encode(old))
        for section, values in files.items():
            data[section] = {**data[section], **values}
        with pytest.raises(ConfigError, match="may not change the files"):
            check_posted(old, parse_config(data))


async def test_routing_state_is_kept_and_a_pipeline_while_its_settings_are(
    running: RunningGateway,
) -> None:
    router = running.gateway.clusters["m"].router
    await reload(running, config([A, C]))  # backends alone changed
    kept = running.gateway.clusters["m"].router
    assert kept.pipeline is router.pipeline and kept.pool is router.pool
    await reload(running, config([A, C], pool={"policy": "least_requests"}))
    changed = running.gateway.clusters["m"].router
    assert changed.pipeline is not router.pipeline
    assert running._rebuild is not None  # the same stores: in-flight counts, index, sessions
    assert running._rebuild.kept.contexts["m"].board is changed.pool.board


async def test_a_backend_listed_again_while_it_drains_stays(running: RunningGateway) -> None:
    pool = running.pools["m"]
    b = pool.members["127.0.0.2:9"]
    pool.begin("127.0.0.2:9", 0.0)  # a request in flight to it
    await reload(running, config([A]))
    assert pool.retiring(b) and b.flags & HealthFlag.GONE
    await reload(running, config([A, B]))
    assert pool.members["127.0.0.2:9"] is b and not pool.retiring(b) and not b.flags
    pool.end("127.0.0.2:9", 0.0)
    assert "127.0.0.2:9" in pool.members  # its last request ended: it stays


async def test_what_a_detector_switched_off_had_set_is_cleared() -> None:
    probed = {"interval_s": 60.0}  # no probe within the test
    running = await start_gateway(config([A, B], pool={"health_check": probed}))
    try:
        pool = running.pools["m"]
        a = pool.members["127.0.0.1:9"]
        a.flags |= HealthFlag.ACTIVE_CHECK_FAILED
        pool.refresh(0.0)
        assert a not in pool.candidates
        await reload(running, config([A, B]))  # health_check off
        assert not a.flags and a in pool.candidates
    finally:
        await running.close()


async def test_a_limit_removed_frees_a_backend_at_it(running: RunningGateway) -> None:
    await reload(running, config([A], pool={"backends": [{"url": A, "max_in_flight": 1}]}))
    pool = running.pools["m"]
    a = pool.members["127.0.0.1:9"]
    pool.begin(a.backend.id, 0.0)
    assert a not in pool.candidates  # at its limit
    await reload(running, config([A]))
    assert a in pool.candidates


async def test_a_posted_config_is_parsed_with_care() -> None:
    async def unchanged(config: Config) -> Config:
        return config

    source = ConfigSource(None, unchanged)
    parsed = await source.parse(b'{"pools": [{"model": "m", "backends": [{"url": "http://a"}]}]}')
    assert parsed.pools[0].model == "m"
    with pytest.raises(ConfigError, match=r"not valid YAML or JSON at line 2, column 1"):
        await source.parse(b"auth: {admin_keys: [sk-secret-key\n")
    with pytest.raises(ConfigError, match="not valid YAML") as refused:
        await source.parse(b"[" * 5000)
    assert "sk-" not in str(refused.value)
    with pytest.raises(ConfigError, match="holds '<redacted>'"):
        await source.parse(b'{"pools": [{"model": "m", "backends": [{"url": "http://a", '
                           b'"api_key": "<redacted>"}]}]}')  # fmt: skip
    with pytest.raises(ConfigError, match="over 1024 KiB"):
        await source.parse(b" " * (2 << 20))


def test_a_keeper_gives_the_same_while_made_from_the_same_and_lets_go_of_the_rest() -> None:
    let_go: list[str] = []
    keeper: Keeper[str] = Keeper(let_go.append)
    assert keeper.get("m", 1, lambda: "first") == "first"
    assert keeper.get("m", 1, lambda: "second") == "first"  # same settings: kept
    assert keeper.get("m", 2, lambda: "third") == "third" and let_go == ["first"]
    keeper.drop("m")
    keeper.drop("m")  # gone already: nothing more to let go
    assert let_go == ["first", "third"]
