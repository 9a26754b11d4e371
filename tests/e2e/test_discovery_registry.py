"""Sim workers that register in Redis (`worker sim --register`) found by a running gateway:
routed to within 2 s of starting; one SIGKILLed under load leaves the pool within its
entry's life and no request fails (retries cover the ones it had). Real processes, a real
redis-server, the official SDK."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import openai

from tests.e2e.procs import fleetgate, gateway, metric
from tests.e2e.test_discovery_file import until
from tests.redis_server import RedisServer

MODEL = "sim-8b"
BEAT_S = 0.5  # each worker's heartbeat: its entry lapses 3 beats after its last


def worker_args(redis: RedisServer) -> list[str]:
    return ["worker", "sim", "--port", "0", "--model", MODEL, "--register", redis.url,
            "--register-prefix", "e2e", "--register-interval", str(BEAT_S)]  # fmt: skip


def test_registered_workers_join_and_a_killed_one_leaves_without_a_failed_request(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(json.dumps({
        "pools": [{"model": MODEL, "policy": "round_robin", "backends": [],
                   "health_check": {"interval_s": 1.0}}],
        "discovery": [{"type": "redis", "url": own_redis.url, "key_prefix": "e2e",
                       "interval_s": 0.25}],
    }))  # fmt: skip
    with fleetgate(worker_args(own_redis)) as first:
        w0 = "http://127.0.0.1:" + first.wait_for(r"on http://127\.0\.0\.1:(\d+)")[0]
        with gateway(["--config", str(config)]) as (url, _):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            source = f"redis:127.0.0.1:{own_redis.port}/0:e2e"
            with fleetgate(worker_args(own_redis)) as second:
                w1 = "http://127.0.0.1:" + second.wait_for(r"on http://127\.0\.0\.1:(\d+)")[0]
                started = time.monotonic()
                until(lambda: (client.completions.create(model=MODEL, prompt="x", max_tokens=1),
                               metric(w1, "vllm:request_success_total") > 0)[1])  # fmt: skip
                joined = time.monotonic() - started
                assert joined < 0.8, joined  # read every 0.25 s, probed at once

                failed, sent, stop = [], [0], threading.Event()

                def load() -> None:  # one request at a time, every other one streamed
                    deadline = time.monotonic() + 15
                    while not stop.is_set() and time.monotonic() < deadline:
                        stream = sent[0] % 2 == 1
                        try:
                            answer = client.completions.create(
                                model=MODEL, prompt="x", max_tokens=8, stream=stream
                            )
                            if stream:
                                assert sum(1 for _ in answer) >= 8  # type: ignore[union-attr]
                        except openai.APIError as exc:
                            failed.append(exc)
                        sent[0] += 1

                loader = threading.Thread(target=load)
                loader.start()
                time.sleep(0.5)
                second.stop(signal.SIGKILL)
                killed = time.monotonic()
                # Out of rotation (its refused connections eject it) well within a heartbeat;
                # it leaves the pool when its registry entry lapses.
                victim = w1.removeprefix("http://")
                out = until(lambda: metric(url, "fleetgate_backend_healthy", backend=victim)
                            == 0, timeout_s=5.0)  # fmt: skip
                until(lambda: metric(url, "fleetgate_discovery_backends", source=source) == 1,
                      timeout_s=5.0)  # fmt: skip
                left = time.monotonic() - killed
                time.sleep(0.5)
                stop.set()
                loader.join()
            print(f"joined in {joined:.2f} s; killed, out of rotation in {out:.3f} s, left in "
                  f"{left:.2f} s; {sent[0]} requests")  # fmt: skip
            assert failed == [] and sent[0] > 10, (failed, sent)
            assert out < BEAT_S, out
            assert left < 3 * BEAT_S + 1.0, left  # its entry's life, and a read
            assert time.monotonic() - killed < 10
            before = metric(w0, "vllm:request_success_total")
            client.completions.create(model=MODEL, prompt="x", max_tokens=1)
            assert metric(w0, "vllm:request_success_total") == before + 1
