"""What the benchmarks share: child processes on free localhost ports, waiting for them to
answer, reading their Prometheus metrics, and what /proc says about a process."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body.decode()


def post(url: str, body: bytes, timeout: float = 5.0) -> str:
    """POST a JSON body; the response's body."""
    request = urllib.request.Request(
        url, data=body, headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer: bytes = response.read()
        return answer.decode()


def wait_http(url: str, seconds: float = 60.0) -> None:
    """Return once `url` answers 2xx; raise if it has not within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            get(url, 2.0)
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {seconds:.0f} s")


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` in Prometheus text whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextmanager
def process(args: Sequence[str]) -> Iterator[subprocess.Popen[str]]:
    """A child with its output on a pipe (read it, or `drain` it), stopped on exit."""
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def drain(proc: subprocess.Popen[str]) -> None:
    """Read the rest of a child's output, so a chatty child never blocks on a full pipe (a
    router that logs every request stops forwarding once 64 KiB of log are unread)."""
    assert proc.stdout is not None
    threading.Thread(target=proc.stdout.read, daemon=True).start()


def read_until(proc: subprocess.Popen[str], pattern: str) -> re.Match[str]:
    """The first line of the child's output that matches `pattern`."""
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(pattern, line)
        if match:
            return match
    raise RuntimeError(f"{proc.args!r} exited before printing {pattern!r}")


@contextmanager
def gateway(config: Path, extra: Sequence[str] = ()) -> Iterator[tuple[str, int]]:
    """`fleetgate serve --config` on a free port: its URL and pid, once it is ready."""
    args = [PY, "-m", "fleetgate", "serve", "--config", str(config), "--port", "0", *extra]
    with process(args) as proc:
        url = read_until(proc, r"listening on (http://\S+)").group(1)
        drain(proc)
        wait_http(url + "/readyz")
        yield url, proc.pid


def streaming_load(
    url: str, out: Path, seconds: float, rate: float, output_len: int
) -> subprocess.Popen[bytes]:
    """`fleetgate bench` sending open-loop streams of 256 prompt and `output_len` answer
    tokens at `rate` a second for `seconds`, each request's record saved under `out`
    (requests.jsonl)."""
    return subprocess.Popen(
        [PY, "-m", "fleetgate", "bench", "--target", url, "--workload", "synthetic",
         "--input-len", "256", "--output-len", str(output_len), "--rate", str(rate),
         "--duration", str(seconds), "--quiet", "--out", str(out), "--save-requests"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def cpu_times() -> tuple[float, float]:
    """The machine's CPU time so far, idle (with I/O wait) and in all."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Redis:
    """A throwaway redis-server on a fixed free port, without persistence, that `kill` ends
    at once (as a crash would) and `start` brings back, empty."""

    def __init__(self, directory: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("needs redis-server (apt-get install -y redis-server)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                      "--appendonly", "no", "--dir", directory, "--logfile", ""]  # fmt: skip
        self._popen: subprocess.Popen[str] | None = None

    def start(self) -> None:
        popen = subprocess.Popen(self._args, stdout=subprocess.PIPE, text=True)
        self._popen = popen
        assert popen.stdout is not None
        for line in popen.stdout:  # its log, until it says it is ready
            if "Ready to accept connections" in line:
                break
        drain(popen)

    def kill(self) -> None:
        if self._popen is not None:
            self._popen.kill()
            self._popen.wait()
            self._popen = None


@contextmanager
def redis_server() -> Iterator[Redis]:
    """A started `Redis`, killed on exit."""
    with tempfile.TemporaryDirectory() as directory:
        redis = Redis(directory)
        redis.start()
        try:
            yield redis
        finally:
            redis.kill()
