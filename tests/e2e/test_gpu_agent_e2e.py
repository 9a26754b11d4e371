"""The GPU agent end to end: a real gateway process in front of two sim workers checked over
HTTP, and the agent (in-process, reading what the test sets) pushing for one of them. A
throttling GPU shifts traffic off it, an XID takes it out, clean readings bring it back."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import msgspec

from fleetgate.fleet.gpu import GpuReading
from fleetgate.http.client import HttpClient
from fleetgate.workers.gpu.agent import AgentSettings, GpuAgent
from tests.e2e.procs import fleetgate, metric, sim_workers

ADMIN, HEARTBEAT, TENANT = "sk-e2e-admin", "sk-e2e-heartbeat", "sk-e2e-tenant"
CLEAN = GpuReading(index=0, temperature_c=60, ecc_uncorrected=0, xid_errors=[],
                   throttle_reasons=[])  # fmt: skip
HOT = GpuReading(index=0, temperature_c=84, ecc_uncorrected=0, xid_errors=[],
                 throttle_reasons=["hw_thermal"])  # fmt: skip
XID = GpuReading(index=0, temperature_c=60, ecc_uncorrected=0, xid_errors=[79],
                 throttle_reasons=[])  # fmt: skip


class Readings:
    """The agent's GpuReader: whatever the test set last."""

    def __init__(self) -> None:
        self.now = [CLEAN, CLEAN]

    def read(self) -> list[GpuReading]:
        return [msgspec.structs.replace(r, index=i) for i, r in enumerate(self.now)]

    def close(self) -> None:
        pass


def backends(gw: str) -> dict[str, Any]:
    request = urllib.request.Request(gw + "/admin/backends",
                                     headers={"authorization": f"Bearer {ADMIN}"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=5) as response:
        return {b["backend"]: b for b in json.loads(response.read())}


def chat(gw: str, n: int) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 1}).encode()  # fmt: skip
    for _ in range(n):
        request = urllib.request.Request(gw + "/v1/chat/completions", data=body, headers={
            "authorization": f"Bearer {TENANT}", "content-type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200


def served(gw: str, backend: str) -> float:
    return metric(gw, "fleetgate_requests_total", backend=backend, status="200")


def test_throttling_xid_and_recovery_steer_traffic(tmp_path: Path) -> None:
    with ExitStack() as stack:
        urls = stack.enter_context(sim_workers("m", 2))
        watched, other = (u.removeprefix("http://") for u in urls)
        config = tmp_path / "gw.yaml"
        config.write_text(json.dumps({
            "server": {"port": 0, "admin": True},
            "auth": {"admin_keys": [ADMIN], "heartbeat_keys": [HEARTBEAT]},
            "tenants": [{"name": "t", "keys": [TENANT]}],
            "pools": [{"model": "m", "policy": "weighted_round_robin",
                       "weights": {"calibrate": False},
                       "gpu": {"enabled": True, "clean_for_s": 0.3, "throttled_weight": 0.5},
                       "backends": [{"url": u} for u in urls]}],
        }))  # fmt: skip
        proc = stack.enter_context(fleetgate(["serve", "--config", str(config)]))
        gw = "http://127.0.0.1:" + proc.wait_for(r"listening on http://127\.0\.0\.1:(\d+)")[0]
        loop = asyncio.new_event_loop()  # the agent's, for the whole test (its connections)
        stack.callback(loop.close)

        def push(agent: GpuAgent) -> None:
            loop.run_until_complete(agent.round())

        readings = Readings()
        settings = AgentSettings(gateway=gw, backend=watched, key=HEARTBEAT)
        said: list[str] = []
        clients = [HttpClient(), HttpClient()]
        for client in clients:  # closed before the loop (the stack unwinds last in, first out)
            stack.callback(lambda c=client: loop.run_until_complete(c.close()))
        agent = GpuAgent(readings, settings, clients[0], say=said.append)

        # Without the heartbeat key the gateway refuses the readings.
        keyless = GpuAgent(readings, AgentSettings(gateway=gw, backend=watched), clients[1],
                           say=said.append)  # fmt: skip
        push(keyless)
        assert said == ["the gateway answered 401: This endpoint needs the heartbeat key: "
                        "`Authorization: Bearer KEY`."]  # fmt: skip

        # One of its two GPUs throttles (thermal): half weight, degraded, a third of the traffic.
        readings.now = [CLEAN, HOT]
        push(agent)
        view = backends(gw)[watched]
        assert (view["verdict"], view["weight"]) == ("degraded", 0.5)
        assert view["gpu"]["throttling"] == ["gpu 1: hw_thermal"]
        chat(gw, 30)
        assert 8 <= served(gw, watched) <= 12  # weighted round robin: 1 in 3 of 30
        assert metric(gw, "fleetgate_backend_gpu_throttled", backend=watched, gpu="1",
                      reason="hw_thermal") == 1  # fmt: skip

        # An XID: out of routing, nothing more goes there.
        readings.now = [XID, CLEAN]
        push(agent)
        view = backends(gw)[watched]
        assert (view["verdict"], view["flags"]) == ("unhealthy", ["GPU_FAULT"])
        assert view["weight"] == 1.0  # no longer throttling: only out
        before = served(gw, watched)
        chat(gw, 10)
        assert served(gw, watched) == before
        assert metric(gw, "fleetgate_backend_gpu_xid_errors_total", backend=watched) == 1

        # Clean readings for clean_for_s: back, at full weight, taking its share again.
        readings.now = [CLEAN, CLEAN]
        push(agent)
        assert backends(gw)[watched]["verdict"] == "unhealthy"  # clean, but not for long yet
        time.sleep(0.35)  # what is waited for is time itself: the gateway's clean_for_s
        push(agent)
        view = backends(gw)[watched]
        assert (view["verdict"], view["weight"], view["flags"]) == ("healthy", 1.0, [])
        chat(gw, 10)
        assert served(gw, watched) - before >= 4
        changes = {s: metric(gw, "fleetgate_backend_gpu_changes_total", backend=watched, state=s)
                   for s in ("throttled", "fault", "ok")}  # fmt: skip
        assert changes == {"throttled": 1, "fault": 1, "ok": 1}
        assert len(said) == 1  # the keyless agent's refusal only
        assert backends(gw)[other]["gpu"] is None  # no agent there: untouched
