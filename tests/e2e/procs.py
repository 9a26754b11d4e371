"""Real processes for end-to-end tests: sim workers and gateways on free localhost ports."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 30.0


@dataclass
class Proc:
    """A started fleetgate process and the lines it printed."""

    popen: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    ended: bool = False
    _seen: threading.Condition = field(default_factory=threading.Condition)

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._seen:
                self.lines.append(line.rstrip("\n"))
                self._seen.notify_all()
        with self._seen:
            self.ended = True
            self._seen.notify_all()

    def wait_for(
        self, pattern: str, count: int = 1, timeout_s: float = START_TIMEOUT_S
    ) -> list[str]:
        """The first `count` matches of `pattern` in the output, waiting for them."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        with self._seen:
            while True:
                found = [m.group(1) for line in self.lines if (m := regex.search(line))]
                if len(found) >= count:
                    return found[:count]
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.ended:
                    break
                self._seen.wait(min(remaining, 0.5))
        raise RuntimeError(f"no {pattern!r} in output:\n" + "\n".join(self.lines))

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode

    def kill_group(self) -> None:
        """SIGKILL it and every process of its session (started with `new_session`)."""
        with suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()


@contextmanager
def fleetgate(args: Sequence[str]) -> Iterator[Proc]:
    """Run `python -m fleetgate ARGS`, collecting its output; stop it afterwards."""
    with python([sys.executable, "-m", "fleetgate", *args]) as proc:
        yield proc


@contextmanager
def python(command: Sequence[str], new_session: bool = False) -> Iterator[Proc]:
    """Run `command`, collecting its output; stop it afterwards (with `new_session`, it and
    every process it started)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    popen = subprocess.Popen(
        list(command),
        start_new_session=new_session,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    proc = Proc(popen)
    threading.Thread(target=proc._pump, name=f"pump-{popen.pid}", daemon=True).start()
    try:
        yield proc
    finally:
        proc.stop()


@contextmanager
def sim_workers(
    model: str, replicas: int, profile: str = "h100-llama3-8b", slowdown: float = 1.0
) -> Iterator[list[str]]:
    """`replicas` sim workers in one process, each step `slowdown` times the profile's time;
    yields their base URLs."""
    args = ["worker", "sim", "--port", "0", "--model", model, "--profile", profile,
            "--replicas", str(replicas), "--slowdown", str(slowdown)]  # fmt: skip
    with fleetgate(args) as proc:
        ports = proc.wait_for(r"on http://127\.0\.0\.1:(\d+)", replicas)
        yield [f"http://127.0.0.1:{p}" for p in ports]


LLAMACPP_SERVER = Path(__file__).parents[1] / "engines" / "llamacpp_server.py"


@contextmanager
def llamacpp_servers(count: int, alias: str) -> Iterator[list[tuple[str, Proc]]]:
    """`count` llama.cpp servers (tests/engines/llamacpp_server.py: the packaged Gemma 3
    270M) on free ports; yields each one's base URL and process once it is healthy."""
    with ExitStack() as stack:
        servers = []
        for _ in range(count):
            port = free_port()
            cmd = [sys.executable, str(LLAMACPP_SERVER), "--port", str(port), "--alias", alias]
            servers.append((f"http://127.0.0.1:{port}", stack.enter_context(python(cmd))))
        for url, _ in servers:
            wait_ready(url + "/health", 60.0)
        yield servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_port_pair() -> int:
    """A free port whose next is free too (a sim worker's KV-event PUB and replay sockets)."""
    for _ in range(100):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two free ports in a row")


@contextmanager
def gateway(args: Sequence[str]) -> Iterator[tuple[str, Proc]]:
    """A gateway on a free port; yields its base URL once it is ready."""
    with fleetgate(["serve", "--port", "0", *args]) as proc:
        port = proc.wait_for(r"listening on http://127\.0\.0\.1:(\d+)")[0]
        url = f"http://127.0.0.1:{port}"
        wait_ready(url + "/readyz")
        yield url, proc


def write_config(path: Path, pools: dict[str, list[str]], **server: object) -> Path:
    """A gateway config (YAML is a superset of JSON) with one pool per model."""
    config = {
        "server": server,
        "pools": [
            {"model": m, "policy": "round_robin", "backends": [{"url": u} for u in urls]}
            for m, urls in pools.items()
        ],
    }
    path.write_text(json.dumps(config))
    return path


def wait_ready(url: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not ready after {timeout_s} s")
        time.sleep(0.05)


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus sample's values over series matching `labels`."""
    _, _, body = get(url + "/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def stream_killing(
    stream: Iterable[Any], after_tokens: int, kill: Callable[[], None]
) -> tuple[set[str], int | None]:
    """Read a chat stream, calling `kill` once `after_tokens` content chunks have come (an
    engine killed mid-answer); the stream ids seen and the final usage's completion tokens."""
    ids: set[str] = set()
    tokens, completion, killed = 0, None, False
    for chunk in stream:
        ids.add(chunk.id)
        if chunk.choices and chunk.choices[0].delta.content:
            tokens += 1
        if chunk.usage is not None:
            completion = chunk.usage.completion_tokens
        if tokens == after_tokens and not killed:
            kill()
            killed = True
    assert killed, f"the stream ended after {tokens} tokens, before the kill"
    return ids, completion


def streamed_chat(stream: Iterable[Any]) -> tuple[str, int | None]:
    """A chat stream's text and its usage's completion tokens (None without a usage)."""
    texts, completion = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            texts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            completion = chunk.usage.completion_tokens
    return "".join(texts), completion
