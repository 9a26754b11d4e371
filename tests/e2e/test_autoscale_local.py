"""Autoscaling with the local actuator, end to end: a real gateway process starts sim worker
processes as its pool's load asks, and removes them again only after draining them, with
streams in flight, none cut. Real workers, the official SDK, GET /admin/autoscale and the
gauges."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from pathlib import Path
from typing import Any

import openai

from tests.e2e.procs import gateway, metric
from tests.e2e.test_discovery_file import until

MODEL = "sim-8b"


def status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/admin/autoscale", timeout=10) as response:
        pools: list[dict[str, Any]] = json.loads(response.read())["pools"]
    return pools[0] if pools else {}


def test_the_pool_grows_under_load_and_shrinks_after_draining_without_cutting_a_stream(
    tmp_path: Path,
) -> None:
    autoscale = {
        "enabled": True, "min_replicas": 1, "max_replicas": 3, "interval_s": 0.25,
        "target_in_flight": 2, "scale_down_window_s": 2.0, "smoothing_s": 0.5,
        "local": {"profile": "h100-llama3-8b"},
    }  # fmt: skip
    pool = {"model": MODEL, "policy": "least_loaded", "backends": [],
            "health_check": {"interval_s": 0.25}, "slow_start_s": 0.5,
            "autoscale": autoscale}  # fmt: skip
    config = tmp_path / "gw.json"
    config.write_text(json.dumps({"server": {"admin": True}, "pools": [pool]}))
    with gateway(["--config", str(config)]) as (url, _):
        until(lambda: status(url).get("replicas") == 1, timeout_s=30)  # min_replicas: started
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        failed: list[BaseException] = []
        tokens: list[int] = []
        stops = [threading.Event() for _ in range(8)]

        def stream(stop: threading.Event) -> None:  # ~1 s streams, one after another
            while not stop.is_set():
                try:
                    chunks = client.completions.create(
                        model=MODEL, prompt="x", max_tokens=150, stream=True,
                        extra_body={"ignore_eos": True},
                    )  # fmt: skip
                    tokens.append(sum(1 for c in chunks if c.choices and c.choices[0].text))
                except BaseException as exc:  # the test's verdict
                    failed.append(exc)
                    return

        readers = [threading.Thread(target=stream, args=(stop,)) for stop in stops]
        for reader in readers:
            reader.start()
        try:
            until(lambda: status(url).get("replicas") == 3, timeout_s=30)  # 8 in flight / 2
            assert metric(url, "fleetgate_autoscale_desired_replicas", model=MODEL) == 3
            ports = {b["url"] for b in backends(url)}
            for stop in stops[2:]:  # 2 streams left: 1 replica carries them
                stop.set()
            until(lambda: status(url).get("scaled_down") == 2, timeout_s=40)
            assert status(url)["replicas"] == 1 and not status(url)["draining"]
        finally:
            for stop in stops:
                stop.set()
            for reader in readers:
                reader.join(30)
        assert not failed
        assert len(tokens) >= 8 and set(tokens) == {150}  # every stream whole
        left = {b["url"] for b in backends(url)}
        assert len(left) == 1
        for gone in ports - left:  # drained, removed, then stopped
            until(lambda gone=gone: not listening(gone))
    # The gateway stopped: so did the worker it had left.
    for url_ in left:
        until(lambda url_=url_: not listening(url_))


def backends(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url + "/admin/backends", timeout=10) as response:
        found: list[dict[str, Any]] = json.loads(response.read())
    return found


def listening(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return False
    return True


def test_the_demo_config_starts_its_first_worker_and_serves() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "autoscale-local.yaml"
    with gateway(["--config", str(example)]) as (url, _):
        until(lambda: status(url).get("replicas") == 1, timeout_s=30)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model=MODEL, prompt="x", max_tokens=4)
        assert answer.choices[0].text
        assert status(url)["actuator"] == "local" and status(url)["floor"] == 1
