"""A real gateway following real sim workers' KV-cache events over ZMQ: it routes a prompt to
the engine that holds its prefix even when that engine got it from elsewhere (no decision of
the gateway's could tell), in either encoding, and forgets an engine that restarted."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import openai
import pytest

from tests.e2e.procs import fleetgate, free_port, free_port_pair, gateway, metric
from tests.redis_server import RedisServer

MODEL = "kv-8b"
BLOCKS = "fleetgate_kv_events_blocks"


def prompt(topic: int) -> list[dict[str, str]]:
    """A long prompt (about 600 tokens) of its own per topic."""
    return [{"role": "user", "content": f"topic {topic}: " + " ".join(["alpha"] * 600)}]


def ask_directly(url: str, messages: list[dict[str, str]]) -> None:
    """A chat request straight to a worker, behind the gateway's back."""
    body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": 1}).encode()
    request = urllib.request.Request(
        url + "/v1/chat/completions", body, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def until(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def hits(url: str) -> float:
    return metric(url, "vllm:prefix_cache_hits_total")


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_a_prompt_goes_to_the_engine_that_holds_it(encoding: str, tmp_path: Path) -> None:
    # Each worker's replay socket is its PUB port + 1.
    ports = [(free_port(), pub, pub + 1) for pub in (free_port_pair() for _ in range(3))]
    workers = []
    backends = []
    for http, pub, replay in ports:
        workers.append(f"http://127.0.0.1:{http}")
        backends.append({
            "url": workers[-1],
            "kv_events": {"endpoint": f"tcp://127.0.0.1:{pub}",
                          "replay_endpoint": f"tcp://127.0.0.1:{replay}"},
        })  # fmt: skip
    config = tmp_path / "gw.yaml"
    config.write_text(json.dumps({"pools": [
        {"model": MODEL, "policy": "prefix_cache", "backends": backends}
    ]}))  # fmt: skip
    with ExitStack() as stack:
        for http, pub, _ in ports:
            stack.enter_context(fleetgate([
                "worker", "sim", "--port", str(http), "--model", MODEL,
                "--kv-events-port", str(pub), "--kv-events-encoding", encoding,
            ])).wait_for(r"KV events on (tcp:\S+)")  # fmt: skip
        url, _ = stack.enter_context(gateway(["--config", str(config)]))
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        for topic, worker in enumerate([2, 0, 1, 2]):
            # The engine gets the prompt behind the gateway's back; its events tell.
            backend = workers[worker].removeprefix("http://")
            held = metric(url, BLOCKS, backend=backend)
            ask_directly(workers[worker], prompt(topic))
            heard = until(lambda b=backend, h=held: metric(url, BLOCKS, backend=b) > h)
            assert heard, "the gateway never heard the engine's events"
            before = [hits(w) for w in workers]
            client.chat.completions.create(model=MODEL, messages=prompt(topic), max_tokens=1)
            gained = [hits(w) - b for w, b in zip(workers, before, strict=True)]
            assert gained[worker] >= 600, gained  # served where the prefix was
        assert metric(url, "fleetgate_kv_events_undecodable_total") == 0


def test_an_engine_that_restarts_is_forgotten_at_its_first_batch(tmp_path: Path) -> None:
    http, pub = free_port(), free_port_pair()
    replay = pub + 1  # the worker's replay socket
    worker = f"http://127.0.0.1:{http}"
    args = ["worker", "sim", "--port", str(http), "--model", MODEL, "--kv-events-port", str(pub)]
    config = tmp_path / "gw.yaml"
    config.write_text(json.dumps({"pools": [{"model": MODEL, "backends": [{
        "url": worker,
        "kv_events": {"endpoint": f"tcp://127.0.0.1:{pub}",
                      "replay_endpoint": f"tcp://127.0.0.1:{replay}"},
    }]}]}))  # fmt: skip
    backend = worker.removeprefix("http://")
    with fleetgate(args) as first, gateway(["--config", str(config)]) as (url, _):
        first.wait_for(r"KV events on (tcp:\S+)")
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        client.chat.completions.create(model=MODEL, messages=prompt(1), max_tokens=1)
        assert until(lambda: metric(url, BLOCKS, backend=backend) >= 37)
        first.stop()
        with fleetgate(args) as second:
            second.wait_for(r"KV events on (tcp:\S+)")
            restarts = "fleetgate_kv_events_restarts_total"
            # Forgotten once the feed reconnects and the replay socket lacks its last batch.
            assert until(lambda: metric(url, restarts, backend=backend) == 1)
            assert metric(url, BLOCKS, backend=backend) == 0
            short = [{"role": "user", "content": " ".join(["beta"] * 60)}]  # 70 tokens
            ask_directly(worker, short)
            # The new engine's prompt (4 blocks) is known, and nothing of the old one's.
            assert until(lambda: metric(url, BLOCKS, backend=backend) == 4)
            assert metric(url, restarts, backend=backend) == 1


def test_built_in_sim_backends_publish_when_asked(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(json.dumps({"pools": [{"model": MODEL, "policy": "round_robin",
        "backends": [
            {"sim": "h100-llama3-8b", "kv_events": {}},
            {"sim": "h100-llama3-8b", "kv_events": {"encoding": "array"}},
        ]}]}))  # fmt: skip
    with gateway(["--config", str(config)]) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        for topic in range(2):  # round robin: one each
            client.chat.completions.create(model=MODEL, messages=prompt(topic), max_tokens=1)
        assert until(lambda: metric(url, BLOCKS) >= 2 * 37)
        assert metric(url, "fleetgate_kv_events_batches_total") >= 2
        assert metric(url, "fleetgate_kv_events_undecodable_total") == 0


def test_gateways_on_one_redis_tell_each_other_the_prompts_they_sent(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """What a gateway sent to an engine that has not reported it yet reaches the other
    gateway through Redis (the engine's events reach both by themselves)."""
    http, pub = free_port(), free_port_pair()
    replay = pub + 1  # the worker's replay socket
    worker = f"http://127.0.0.1:{http}"
    config = tmp_path / "gw.yaml"
    config.write_text(json.dumps({
        "pools": [{"model": MODEL, "policy": "prefix_cache", "backends": [{
            "url": worker, "kv_events": {"endpoint": f"tcp://127.0.0.1:{pub}",
                                         "replay_endpoint": f"tcp://127.0.0.1:{replay}"},
        }]}],
        "state": {"url": own_redis.url},
    }))  # fmt: skip
    heard = "fleetgate_shared_state_heard_total"
    with ExitStack() as stack:
        stack.enter_context(fleetgate([
            "worker", "sim", "--port", str(http), "--model", MODEL, "--kv-events-port", str(pub),
        ])).wait_for(r"KV events on (tcp:\S+)")  # fmt: skip
        a, _ = stack.enter_context(gateway(["--config", str(config)]))
        b, _ = stack.enter_context(gateway(["--config", str(config)]))
        backend = worker.removeprefix("http://")
        assert until(lambda: metric(a, BLOCKS, backend=backend) >= 0 and
                     metric(b, BLOCKS, backend=backend) >= 0)  # fmt: skip
        ask_directly(worker, prompt(99))  # each gateway follows the engine from here
        assert until(lambda: metric(b, BLOCKS, backend=backend) > 0)
        client = openai.OpenAI(base_url=a + "/v1", api_key="none", max_retries=0)
        client.chat.completions.create(model=MODEL, messages=prompt(1), max_tokens=1)
        assert until(lambda: metric(b, heard, part="engine_blocks") >= 1)
        assert metric(a, heard, part="engine_blocks") == 0  # never its own back
