"""The ways to start the gateway: the built-in fleet with no config, and fronting existing
servers with --backend, plus a config error that names the bad key."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai

from tests.e2e.procs import fleetgate, gateway, metric, sim_workers


def _children(pid: int) -> list[int]:
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


def test_no_config_serves_a_built_in_fleet_and_ctrl_c_stops_it_all() -> None:
    with gateway([]) as (url, proc):
        text = "\n".join(proc.lines)
        assert "llama-3.1-8b-instruct" in text and "llama-3.3-70b-instruct" in text
        assert "curl" in text and "OpenAI(base_url=" in text
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        assert len(list(client.models.list())) == 2
        reply = client.chat.completions.create(
            model="llama-3.1-8b-instruct",
            messages=[{"role": "user", "content": "Hello!"}],
            max_tokens=4,
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 4
        sims = _children(proc.popen.pid)
        assert sims, "the built-in workers run in a child process"
        assert proc.stop(signal.SIGINT) == 0
        deadline = time.monotonic() + 10
        while alive := [
            pid for pid in sims if Path(f"/proc/{pid}").exists() and not _is_zombie(pid)
        ]:
            assert time.monotonic() < deadline, f"left running: {alive}"
            time.sleep(0.05)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_backend_flags_learn_models_from_each_server() -> None:
    with sim_workers("model-a", 2) as a, sim_workers("model-b", 1) as b:
        args = ["--backend", a[0], "--backend", a[1], "--backend", b[0], "--policy", "round_robin"]
        with gateway(args) as (url, _):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            assert sorted(m.id for m in client.models.list()) == ["model-a", "model-b"]
            for _ in range(4):
                client.completions.create(model="model-a", prompt="x", max_tokens=1)
            client.completions.create(model="model-b", prompt="x", max_tokens=1)
            assert [metric(w, "vllm:request_success_total") for w in a] == [2, 2]
            assert metric(b[0], "vllm:request_success_total") == 1


def test_a_config_error_names_the_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("pools:\n  - model: m\n    polcy: random\n    backends: [{url: http://x}]\n")
    result = subprocess.run(
        [sys.executable, "-m", "fleetgate", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    assert result.returncode == 2
    assert "polcy" in result.stderr and "pools[0]" in result.stderr


def test_unknown_policy_lists_the_known_ones(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        "pools:\n  - model: m\n    policy: fastest\n    backends: [{url: http://x}]\n"
    )
    with fleetgate(["serve", "--config", str(config), "--port", "0"]) as proc:
        assert proc.popen.wait(30) == 2
    output = "\n".join(proc.lines)
    assert "fastest" in output and "least_requests" in output


def test_the_least_loaded_profile_serves_through_scraped_engine_load() -> None:
    with sim_workers("model-a", 2) as workers:
        args = ["--backend", workers[0], "--backend", workers[1], "--policy", "least_loaded"]
        with gateway(args) as (url, _):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            for _ in range(6):
                reply = client.completions.create(model="model-a", prompt="x", max_tokens=2)
                assert reply.usage is not None and reply.usage.completion_tokens == 2
            assert sum(metric(w, "vllm:request_success_total") for w in workers) == 6
