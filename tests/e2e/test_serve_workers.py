"""`fleetgate serve --workers 2`: two real gateway processes on one port, the kernel spreading
connections over both; a worker that dies started again; SIGTERM stops them all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from fleetgate.config import ConfigError, parse_config
from fleetgate.processes import check_workers, unshared
from tests.e2e.procs import Proc, gateway, metric, sim_workers
from tests.redis_server import RedisServer

MODEL = "workers-8b"
REQUESTS = 41  # odd: two workers cannot have served equal shares


@pytest.fixture(scope="module")
def workers_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Proc]]:
    with sim_workers(MODEL, 1) as urls:
        config = tmp_path_factory.mktemp("workers") / "gw.yaml"
        config.write_text(json.dumps({"pools": [{"model": MODEL, "backends": [{"url": urls[0]}]}]}))
        with gateway(["--config", str(config), "--workers", "2"]) as (url, proc):
            proc.wait_for(r"worker (1) listening on port")
            yield url, proc


def chat(url: str) -> int:
    """One request on a connection of its own (urllib opens one each time)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    request = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(),
        {"content-type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        status: int = response.status
        return status


def workers_of(pid: int) -> list[int]:
    """The worker processes of the supervisor `pid` (not multiprocessing's own helpers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and b"spawn_main" in (stat.parent / "cmdline").read_bytes():
            found.append(int(stat.parent.name))
    return found


def test_both_workers_answer_on_the_one_port(workers_fleet: tuple[str, Proc]) -> None:
    url, _ = workers_fleet
    before = {metric(url, "fleetgate_requests_total") for _ in range(30)}
    assert all(chat(url) == 200 for _ in range(REQUESTS))
    # Each scrape reaches one worker, on a new connection: its own count.
    seen = {metric(url, "fleetgate_requests_total") for _ in range(30)}
    assert len(seen) == 2, seen
    assert sum(seen) - sum(before) == REQUESTS
    assert min(seen) > min(before)  # both served some


def test_the_batch_api_is_off_and_the_start_says_so(workers_fleet: tuple[str, Proc]) -> None:
    url, proc = workers_fleet
    proc.wait_for(r"(the Batch API is off)")
    request = urllib.request.Request(url + "/v1/batches", method="GET")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 404


def test_a_worker_that_dies_is_started_again(workers_fleet: tuple[str, Proc]) -> None:
    url, proc = workers_fleet
    workers = workers_of(proc.popen.pid)
    assert len(workers) == 2, workers
    os.kill(workers[0], signal.SIGKILL)
    proc.wait_for(r"worker (\d) exited \(-9\); starting it again")
    proc.wait_for(r"(listening) ", 3)  # the first banner, worker 1's line, the new one's
    again = workers_of(proc.popen.pid)
    assert len(again) == 2 and workers[0] not in again
    assert all(chat(url) == 200 for _ in range(10))


def test_sigterm_stops_every_worker(tmp_path: Path) -> None:
    with sim_workers(MODEL, 1) as urls:
        config = tmp_path / "gw.yaml"
        config.write_text(json.dumps({"pools": [{"model": MODEL, "backends": [{"url": urls[0]}]}]}))
        with gateway(["--config", str(config), "--workers", "2"]) as (url, proc):
            proc.wait_for(r"worker (1) listening on port")
            workers = workers_of(proc.popen.pid)
            assert len(workers) == 2 and chat(url) == 200
            assert proc.stop(signal.SIGTERM) == 0  # drained, then stopped
            assert not [p for p in workers if Path(f"/proc/{p}").exists()]


def test_limits_counted_in_each_workers_memory_are_refused() -> None:
    config = parse_config({
        "pools": [{"model": "m", "backends": [{"url": "http://127.0.0.1:9"}]}],
        "tenants": [{"name": "t", "keys": ["sk-workers-test-key"],
                     "limits": {"requests_per_minute": 60}}],
    })  # fmt: skip
    check_workers(config, 1)
    with pytest.raises(ConfigError, match=r"enforced 2 times over; set limits\.store: redis"):
        check_workers(config, 2)
    assert unshared(config, 1) is None
    said = unshared(config, 2)
    assert said is not None and "set state.url to share the load" in said


def test_workers_that_cannot_start_stop_the_supervisor(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(json.dumps({
        "pools": [{"model": MODEL, "backends": [{"url": "http://127.0.0.1:9"}]}],
        "request_log": {"path": str(tmp_path / "no such directory" / "requests.log")},
    }))  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "fleetgate", "serve", "--config", str(config), "--port", "0",
         "--workers", "2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "keeps exiting at start" in done.stderr
    assert "request_log.path: cannot append to it" in done.stderr


def test_with_shared_state_the_workers_share_the_batches(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """Each upload, create and poll may reach either worker; the batch runs once."""
    with sim_workers(MODEL, 1) as urls:
        config = tmp_path / "gw.yaml"
        config.write_text(json.dumps({
            "pools": [{"model": MODEL, "backends": [{"url": urls[0]}]}],
            "state": {"url": own_redis.url}, "batches": {"dir": str(tmp_path / "batches")},
        }))  # fmt: skip
        with gateway(["--config", str(config), "--workers", "2"]) as (url, proc):
            proc.wait_for(r"worker (1) listening on port")
            assert not [line for line in proc.lines if "Batch API is off" in line]
            sdk = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            lines = [
                {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": MODEL, "max_tokens": 4,
                          "messages": [{"role": "user", "content": f"Question {i}?"}]}}
                for i in range(10)
            ]  # fmt: skip
            data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
            for _ in range(3):  # new connections: each may reach either worker
                file = sdk.files.create(file=("in.jsonl", data), purpose="batch")
                batch = sdk.batches.create(
                    input_file_id=file.id, endpoint="/v1/chat/completions",
                    completion_window="24h",
                )  # fmt: skip
                for _ in range(300):
                    batch = sdk.batches.retrieve(batch.id)
                    if batch.status == "completed":
                        break
                    time.sleep(0.1)
                assert batch.status == "completed" and batch.output_file_id is not None
                answers = sdk.files.content(batch.output_file_id).text.splitlines()
                ids = sorted(json.loads(line)["custom_id"] for line in answers)
                assert ids == sorted(f"q{i}" for i in range(10))  # each once
