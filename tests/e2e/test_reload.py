"""A running gateway's config reloaded (SIGHUP, its file changing, POST /admin/config): a
stream in flight finishes on the config it began with, the backends follow the new config,
and a broken or restart-only config is refused with the old one kept. Real sim workers, a
real gateway process, the official SDK."""

from __future__ import annotations

import json
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai

from tests.e2e.procs import gateway, metric, sim_workers
from tests.e2e.test_discovery_file import served, until

MODEL = "sim-8b"


def write(path: Path, backends: list[str], **extra: Any) -> None:
    pool = {"model": MODEL, "policy": "round_robin", "backends": [{"url": u} for u in backends],
            "health_check": {"interval_s": 1.0}}  # fmt: skip
    config = {"server": {"admin": True, **extra.pop("server", {})}, "pools": [pool], **extra}
    path.write_text(json.dumps(config))


def reloads(url: str, via: str, result: str) -> float:
    return metric(url, "fleetgate_config_reloads_total", via=via, result=result)


def post(url: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_sighup_reload_keeps_streams_and_refuses_broken_configs(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    with sim_workers(MODEL, 3) as (w0, w1, w2):
        write(config, [w0])
        with gateway(["--config", str(config)]) as (url, proc):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            streamed: list[str] = []
            failed: list[BaseException] = []

            def stream() -> None:  # ~2.5 s of tokens, begun on the first config
                try:
                    chunks = client.completions.create(
                        model=MODEL, prompt="x", max_tokens=400, stream=True,
                        extra_body={"ignore_eos": True},
                    )  # fmt: skip
                    streamed.extend(c.choices[0].text for c in chunks if c.choices)
                except BaseException as exc:  # the test's verdict
                    failed.append(exc)

            reader = threading.Thread(target=stream)
            reader.start()
            until(lambda: metric(w0, "vllm:num_requests_running") == 1)
            write(config, [w1, w2])  # w0 leaves, w1 and w2 join
            proc.popen.send_signal(signal.SIGHUP)
            until(lambda: reloads(url, "signal", "success") == 1)
            assert metric(w0, "vllm:num_requests_running") == 1  # still streaming
            reader.join(30)
            assert not failed and len(streamed) >= 300  # whole, on the config it began with

            def ask() -> None:
                client.completions.create(model=MODEL, prompt="x", max_tokens=1)

            until(lambda: (ask(), served(w1) > 0 and served(w2) > 0)[1])
            before = served(w0)
            for _ in range(6):
                ask()
            assert served(w0) == before  # drained, then gone

            config.write_text("pools: [")  # broken: refused, the running config kept
            proc.popen.send_signal(signal.SIGHUP)
            until(lambda: reloads(url, "signal", "failure") == 1)
            assert metric(url, "fleetgate_config_last_reload_successful") == 0
            proc.wait_for(r"config reload \(signal\) refused, the config in use kept: (.*YAML)")
            ask()

            write(config, [w1], server={"connect_timeout_s": 2.0})  # only a restart applies it
            proc.popen.send_signal(signal.SIGHUP)
            until(lambda: reloads(url, "signal", "failure") == 2)
            proc.wait_for(r"(server\.connect_timeout_s) changed: these take effect only at a rest")
            counts = served(w1), served(w2)
            for _ in range(4):
                ask()
            assert served(w1) > counts[0] and served(w2) > counts[1]  # still both


def test_file_watch_and_admin_api(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    audit = tmp_path / "audit.jsonl"
    server = {"watch_config_s": 0.2, "audit_log": str(audit)}
    with sim_workers(MODEL, 2) as (w0, w1):
        write(config, [w0], server=server)
        with gateway(["--config", str(config)]) as (url, _):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

            def ask() -> None:
                client.completions.create(model=MODEL, prompt="x", max_tokens=1)

            write(config, [w1], server=server)  # watched: no signal needed
            until(lambda: reloads(url, "file", "success") == 1)
            until(lambda: (ask(), served(w1) > 0)[1])

            posted = {"server": {"admin": True, **server},
                      "pools": [{"model": MODEL, "backends": [{"url": w0}]}]}  # fmt: skip
            status, body = post(url + "/admin/config", json.dumps(posted).encode())
            assert (status, body) == (200, {"status": "reloaded"})
            until(lambda: (ask(), served(w0) > 0)[1])

            # A config sent over the network may not choose the files the gateway writes.
            posted["request_log"] = {"path": str(tmp_path / "elsewhere.log")}
            status, body = post(url + "/admin/config", json.dumps(posted).encode())
            assert status == 400 and body["error"]["code"] == "invalid_config"
            assert "request_log.path" in body["error"]["message"]
            status, body = post(url + "/admin/config", b"pools: [")
            assert status == 400 and "not valid YAML" in body["error"]["message"]
            assert reloads(url, "admin", "failure") == 2
            lines = [json.loads(line)["event"] for line in audit.read_text().splitlines()]
            assert lines.count("admin_config_reloaded") == 1
            assert lines.count("admin_config_refused") == 2
