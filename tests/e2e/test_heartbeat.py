"""Heartbeat mode: workers push heartbeats; one that stops is taken out of rotation."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from tests.e2e.procs import fleetgate, free_port, metric


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def post(url: str, body: object) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_worker_that_stops_heartbeating_leaves_rotation_and_returns(tmp_path: Path) -> None:
    gw_port = free_port()
    gw_url = f"http://127.0.0.1:{gw_port}"
    with ExitStack() as stack:
        workers = []
        for _ in range(2):
            proc = stack.enter_context(fleetgate([
                "worker", "sim", "--port", "0", "--model", "m",
                "--heartbeat", gw_url, "--heartbeat-interval", "0.1",
            ]))  # fmt: skip
            port = proc.wait_for(r"on http://127\.0\.0\.1:(\d+)")[0]
            workers.append(f"http://127.0.0.1:{port}")
        check = {"kind": "heartbeat", "interval_s": 0.3, "jitter": 0.1,
                 "unhealthy_threshold": 2, "healthy_threshold": 1}  # fmt: skip
        config = tmp_path / "gw.yaml"
        config.write_text(json.dumps({"server": {"port": gw_port}, "pools": [
            {"model": "m", "health_check": check, "backends": [{"url": w} for w in workers]}
        ]}))  # fmt: skip
        stack.enter_context(fleetgate(["serve", "--config", str(config)])).wait_for(r"(listening)")
        quiet = workers[0][7:]
        assert post(workers[0] + "/admin/faults", {"hang": True}) == 200  # no more heartbeats
        wait_until(lambda: metric(gw_url, "fleetgate_backend_healthy", backend=quiet) == 0)
        assert metric(gw_url, "fleetgate_backend_healthy", backend=workers[1][7:]) == 1
        assert post(workers[0] + "/admin/faults", {"hang": False}) == 200
        wait_until(lambda: metric(gw_url, "fleetgate_backend_healthy", backend=quiet) == 1)
        assert post(gw_url + "/fleet/heartbeat", {"backend": "10.9.9.9:1"}) == 404
        assert post(gw_url + "/fleet/heartbeat", {"nope": 1}) == 400
