"""A real redis-server for tests: installed when missing (Debian's package, as root), started on
a free 127.0.0.1 port in a temporary directory with no persistence, killed and restarted at will.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.debian import debian_program
from tests.e2e.procs import free_port

START_TIMEOUT_S = 10.0


def redis_server_binary() -> str:
    """The redis-server executable, installed from Debian's package when missing."""
    return debian_program("redis-server", "redis-server")


class RedisServer:
    """One redis-server process at a fixed port, which `kill` ends at once (as a crash would)
    and `start` brings back, empty, on the same port."""

    def __init__(self, binary: str, directory: Path) -> None:
        self._binary = binary
        self._directory = directory
        self.port = free_port()
        self._popen: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self._binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self._directory),
                "--logfile", "", "--daemonize", "no"]  # fmt: skip
        popen = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._popen = popen
        ready = threading.Event()
        lines: list[str] = []

        def pump() -> None:  # read its log until it is ready, then keep its pipe drained
            assert popen.stdout is not None
            for line in popen.stdout:
                lines.append(line)
                if "Ready to accept connections" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=pump, name=f"redis-{self.port}", daemon=True).start()
        if not ready.wait(START_TIMEOUT_S) or popen.poll() is not None:
            self.kill()
            raise RuntimeError("redis-server did not start:\n" + "".join(lines))

    def pause(self) -> None:
        """Stop it answering while its sockets stay open (a hung Redis, not a dead one)."""
        assert self._popen is not None
        self._popen.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._popen is not None
        self._popen.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self._popen is not None and self._popen.poll() is None:
            self._popen.kill()
            self._popen.wait()
        self._popen = None


@contextmanager
def redis_server(directory: Path) -> Iterator[RedisServer]:
    directory.mkdir(parents=True, exist_ok=True)
    server = RedisServer(redis_server_binary(), directory)
    server.start()
    try:
        yield server
    finally:
        server.kill()
