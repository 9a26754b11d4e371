"""Backends found in a watched file by a running gateway: routed to once probed, drained when
not ready, gone when removed; a broken file keeps the last good set. Real sim workers, a real
gateway, the official SDK."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from tests.e2e.procs import gateway, get, metric, sim_workers

MODEL = "sim-8b"


def listing(path: Path, backends: list[dict[str, object]] | str) -> None:
    """Write the file of backends as a careful writer does: a new file renamed over it."""
    new = path.with_suffix(".new")
    new.write_text(backends if isinstance(backends, str) else json.dumps({"backends": backends}))
    os.replace(new, path)


def until(done: Callable[[], bool], timeout_s: float = 10.0) -> float:
    """Seconds until `done()`; fails past `timeout_s`."""
    start = time.monotonic()
    while not done():
        assert time.monotonic() - start < timeout_s, "not within the time allowed"
        time.sleep(0.05)
    return time.monotonic() - start


def served(worker: str) -> float:
    return metric(worker, "vllm:request_success_total")


def test_backends_follow_the_file(tmp_path: Path) -> None:
    backends = tmp_path / "backends.yaml"
    with sim_workers(MODEL, 2) as (w0, w1):
        listing(backends, [{"model": MODEL, "url": w0}])
        config = tmp_path / "gw.yaml"
        config.write_text(json.dumps({
            "pools": [{"model": MODEL, "policy": "round_robin", "backends": [],
                       "health_check": {"interval_s": 1.0}}],
            "discovery": [{"type": "file", "path": str(backends), "interval_s": 0.2}],
        }))  # fmt: skip
        with gateway(["--config", str(config)]) as (url, _):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

            def ask() -> None:
                client.completions.create(model=MODEL, prompt="x", max_tokens=1)

            source = f"file:{backends}"
            ask()  # found at start, probed before the gateway said it was ready
            assert metric(url, "fleetgate_discovery_backends", source=source) == 1

            listing(backends, [{"model": MODEL, "url": w0}, {"model": MODEL, "url": w1}])
            joined = until(lambda: (ask(), served(w1) > 0)[1])
            assert joined < 0.9  # read within 0.2 s, probed at once (not after its 1 s interval)

            listing(backends, "backends: [")  # broken: the last good set stays
            until(lambda: metric(url, "fleetgate_discovery_source_up", source=source) == 0)
            assert metric(url, "fleetgate_discovery_failures_total", source=source) >= 1
            before = served(w0), served(w1)
            for _ in range(4):
                ask()
            assert served(w0) > before[0] and served(w1) > before[1]

            listing(backends, [{"model": MODEL, "url": w0}, {"model": MODEL, "url": w1,
                                                             "ready": False}])  # fmt: skip
            until(lambda: metric(url, "fleetgate_discovery_source_up", source=source) == 1)
            before = served(w0), served(w1)
            for _ in range(4):
                ask()
            assert served(w1) == before[1] and served(w0) == before[0] + 4  # w1 drained

            listing(backends, [])  # every backend gone: answered 503, never hung
            until(lambda: metric(url, "fleetgate_discovery_backends", source=source) == 0)
            with pytest.raises(openai.APIStatusError) as refused:
                ask()
            assert refused.value.status_code == 503
            assert get(url + "/readyz")[0] == 503
