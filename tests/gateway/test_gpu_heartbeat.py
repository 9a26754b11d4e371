"""POST /fleet/heartbeat with GPU readings, on a gateway whose pool is checked over HTTP (the
agent beside an engine): the heartbeat key, strict validation in OpenAI's error shape, the
readings in /admin/backends and /metrics, and readings that grow stale when the agent stops."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetgate.clock import LoopClock
from fleetgate.config import parse_config
from fleetgate.http.client import HttpClient, Origin
from fleetgate.running import start_gateway

ADMIN, HEARTBEAT = "sk-gpu-admin", "sk-gpu-heartbeat"
BACKEND = "127.0.0.1:9"
READING = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "temperature_c": 71,
           "utilization_gpu_pct": 88, "memory_used_bytes": 7 * 2**30,
           "memory_total_bytes": 80 * 2**30, "power_draw_w": 650.5, "ecc_uncorrected": 0,
           "xid_errors": [], "sm_clock_mhz": 1755,
           "throttle_reasons": ["hw_thermal"]}  # fmt: skip


async def call(port: int, method: bytes, path: bytes, body: object = None,
               key: str | None = HEARTBEAT) -> tuple[int, Any]:  # fmt: skip
    http = HttpClient()
    headers = [(b"content-type", b"application/json")]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    data = b"" if body is None else json.dumps(body).encode()
    try:
        response = await http.request(Origin.parse(f"http://127.0.0.1:{port}"), method, path,
                                      headers, data)  # fmt: skip
        answer = await response.read()
        if path == b"/metrics":
            return response.status, answer.decode()
        return response.status, json.loads(answer)
    finally:
        await http.close()


@pytest.fixture
async def port() -> AsyncIterator[int]:
    config = parse_config({
        "server": {"port": 0, "admin": True},
        "auth": {"admin_keys": [ADMIN], "heartbeat_keys": [HEARTBEAT]},
        "tenants": [{"name": "t", "keys": ["sk-gpu-tenant"]}],
        "pools": [{"model": "m", "health_check": {"enabled": False},
                   "gpu": {"enabled": True, "throttled_weight": 0.5},
                   "backends": [{"url": f"http://{BACKEND}"}, {"url": "http://127.0.0.1:10"}]},
                  {"model": "plain", "health_check": {"enabled": False},
                   "backends": [{"url": "http://127.0.0.1:11"}]}],
    })  # fmt: skip
    running = await start_gateway(config)
    try:
        yield running.port
    finally:
        await running.close()


async def test_readings_need_the_heartbeat_key(port: int) -> None:
    beat = {"backend": BACKEND, "gpu": [READING]}
    for key in (None, ADMIN, "sk-wrong"):
        status, body = await call(port, b"POST", b"/fleet/heartbeat", beat, key=key)
        assert status == 401
        assert body["error"]["code"] == "invalid_api_key"
    status, body = await call(port, b"GET", b"/admin/backends", key=ADMIN)
    assert all(b["gpu"] is None for b in body)  # nothing of a refused beat is kept


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        ([], "length >= 1"),
        ([{**READING, "temperature_c": "hot"}], r"\$.gpu\[0\].temperature_c"),
        ([{**READING, "utilization_gpu_pct": 101}], "<= 100"),
        ([{**READING, "throttle_reasons": ["thermal"]}], "throttle_reasons"),
        ([{**READING, "fan": 3}], "unknown field `fan`"),
        ([{**READING, "xid_errors": list(range(33))}], "length <= 32"),
        ([{**READING, "index": i} for i in range(65)], "length <= 64"),
        ([{**READING, "name": "x" * 201}], "length <= 200"),
        ({"index": 0}, "Expected `array"),
        ([READING, READING], "same `index`"),
    ],
)
async def test_malformed_readings_are_refused_whole_in_openais_shape(
    port: int, gpu: object, expected: str
) -> None:
    status, body = await call(port, b"POST", b"/fleet/heartbeat", {"backend": BACKEND, "gpu": gpu})
    assert status == 400
    assert body["error"]["param"] == "gpu"
    assert body["error"]["type"] == "invalid_request_error"
    assert re.search(expected, body["error"]["message"]), body
    status, listing = await call(port, b"GET", b"/admin/backends", key=ADMIN)
    assert all(b["gpu"] is None for b in listing)


async def test_a_backend_no_pool_takes_readings_from_is_a_404_naming_the_setting(port: int) -> None:
    for backend in ("10.9.9.9:1", "127.0.0.1:11"):  # unknown; in a pool without gpu.enabled
        status, body = await call(port, b"POST", b"/fleet/heartbeat",
                                  {"backend": backend, "gpu": [READING]})  # fmt: skip
        assert status == 404
        assert "gpu.enabled" in body["error"]["message"]
    status, body = await call(port, b"POST", b"/fleet/heartbeat", {"backend": BACKEND})
    assert status == 404  # a plain heartbeat: no pool of this gateway expects those


async def test_readings_show_in_admin_backends_and_metrics(port: int) -> None:
    status, body = await call(port, b"POST", b"/fleet/heartbeat",
                              {"backend": BACKEND, "gpu": [READING]})  # fmt: skip
    assert (status, body) == (200, {"ok": True})
    status, listing = await call(port, b"GET", b"/admin/backends", key=ADMIN)
    view = next(b for b in listing if b["backend"] == BACKEND)
    assert view["verdict"] == "degraded" and view["weight"] == 0.5
    assert view["throttle_share"] == 0.5
    gpu = view["gpu"]
    assert gpu["throttling"] == ["gpu 0: hw_thermal"] and gpu["faults"] == []
    assert gpu["readings"][0]["temperature_c"] == 71 and gpu["age_s"] >= 0
    _, text = await call(port, b"GET", b"/metrics", key=None)
    key = f'backend="{BACKEND}",gpu="0",model="m"'
    assert f"fleetgate_backend_gpu_temperature_celsius{{{key}}} 71.0" in text
    assert f"fleetgate_backend_gpu_utilization_ratio{{{key}}} 0.88" in text
    assert f"fleetgate_backend_gpu_power_watts{{{key}}} 650.5" in text
    assert f"fleetgate_backend_gpu_sm_clock_hertz{{{key}}} 1.755e+09" in text
    assert f'fleetgate_backend_gpu_throttled{{{key},reason="hw_thermal"}} 1.0' in text
    assert f"fleetgate_backend_gpu_ecc_uncorrected_errors_total{{{key}}} 0.0" in text
    assert "fleetgate_backend_gpu_power_limit_watts{" not in text  # not read: absent
    changes = f'backend="{BACKEND}",model="m",state="throttled"'
    assert f"fleetgate_backend_gpu_changes_total{{{changes}}} 1.0" in text


async def test_an_agent_gone_quiet_is_shown_stale_and_its_fault_no_longer_counts() -> None:
    now = [100.0]  # the gateway's clock: only the readings' time to live needs moving
    config = parse_config({
        "server": {"port": 0, "admin": True},
        "auth": {"admin_keys": [ADMIN], "heartbeat_keys": [HEARTBEAT]},
        "pools": [{"model": "m", "health_check": {"enabled": False},
                   "gpu": {"enabled": True, "stale_after_s": 0.4},
                   "backends": [{"url": f"http://{BACKEND}"}, {"url": "http://127.0.0.1:10"}]},
                  {"model": "plain", "health_check": {"enabled": False},
                   "backends": [{"url": "http://127.0.0.1:11"}]}],
    })  # fmt: skip
    running = await start_gateway(config, clock=LoopClock(lambda: now[0]))
    port = running.port
    expired = "fleetgate_backend_gpu_readings_expired_total"
    try:
        _, text = await call(port, b"GET", b"/metrics", key=None)
        assert [line for line in text.splitlines() if line.startswith(expired + "{")] == [
            f'{expired}{{backend="{BACKEND}",model="m"}} 0.0',
            f'{expired}{{backend="127.0.0.1:10",model="m"}} 0.0',
        ]  # from the start, before any agent spoke; none for the pool that takes no readings
        xid = {**READING, "xid_errors": [79], "throttle_reasons": []}
        await call(port, b"POST", b"/fleet/heartbeat", {"backend": BACKEND, "gpu": [xid]})
        view = await _backend_view(port)
        assert (view["verdict"], view["gpu"]["state"]) == ("unhealthy", "fault")

        now[0] += 0.4  # the agent says nothing more: the expiry check, every 0.1 s, drops it
        for _ in range(100):
            view = await _backend_view(port)
            if view["gpu"]["state"] == "stale":
                break
            await asyncio.sleep(0.05)
        assert (view["verdict"], view["flags"], view["weight"]) == ("healthy", [], 1.0)
        gpu = view["gpu"]
        assert gpu["state"] == "stale" and gpu["age_s"] == pytest.approx(0.4)
        assert gpu["faults"] == ["gpu 0: xid 79"]  # what it last said, no longer counting
        _, text = await call(port, b"GET", b"/metrics", key=None)
        assert f'{expired}{{backend="{BACKEND}",model="m"}} 1.0' in text
        assert f'{expired}{{backend="127.0.0.1:10",model="m"}} 0.0' in text
        assert (f'fleetgate_backend_gpu_changes_total{{backend="{BACKEND}",model="m",'
                'state="stale"} 1.0') in text  # fmt: skip
        _, snapshot = await call(port, b"GET", b"/dashboard/snapshot", key=ADMIN)
        tile = next(b for b in snapshot["pools"][0]["backends"] if b["id"] == BACKEND)
        assert tile["gpu"]["state"] == "stale" and tile["gpu"]["age_s"] == pytest.approx(0.4)

        clean = {**READING, "throttle_reasons": []}  # the agent is back
        await call(port, b"POST", b"/fleet/heartbeat", {"backend": BACKEND, "gpu": [clean]})
        view = await _backend_view(port)
        assert (view["gpu"]["state"], view["gpu"]["age_s"]) == ("ok", 0.0)
    finally:
        await running.close()


async def _backend_view(port: int) -> Any:
    _, listing = await call(port, b"GET", b"/admin/backends", key=ADMIN)
    return next(b for b in listing if b["backend"] == BACKEND)
