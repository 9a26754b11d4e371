"""What sharing the routing state costs an idle gateway: its CPU while it only syncs.

    .venv/bin/python benchmarks/sync_cost.py [--seconds 10] [--syncs 0.05/0.05,0.05/0.01]

Two gateways over one pool of 8 sim workers, sending nothing: first without `state.url`
(their own timers alone), then on one Redis at each `sync_s`/`load_sync_s` pair. For each,
the CPU one gateway used over `--seconds`, as a share of a core, beside the unshared
gateway's measured in the same run (a ratio).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from harness import PY, cpu_seconds, drain, gateway, process, read_until, redis_server, wait_http

MODEL = "sync-8b"
BACKENDS = 8


@contextmanager
def sims() -> Iterator[list[str]]:
    args = [PY, "-m", "fleetgate", "worker", "sim", "--port", "0", "--model", MODEL,
            "--replicas", str(BACKENDS)]  # fmt: skip
    with process(args) as proc:
        urls = [read_until(proc, r"on (http://127\.0\.0\.1:\d+)").group(1) for _ in range(BACKENDS)]
        drain(proc)
        for url in urls:
            wait_http(url + "/health")
        yield urls


def idle_cpu(urls: list[str], state: dict[str, object], seconds: float) -> float:
    """The share of a core one of two idle gateways uses with `state`."""
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        config = workdir / "gw.yaml"
        config.write_text(json.dumps({
            "pools": [{"model": MODEL, "backends": [{"url": u} for u in urls]}],
            "request_log": {"enabled": False}, **({"state": state} if state else {}),
        }))  # fmt: skip
        _, pid = stack.enter_context(gateway(config))
        stack.enter_context(gateway(config))
        time.sleep(2.0)  # started: its first scrapes and probes done
        before = cpu_seconds(pid)
        time.sleep(seconds)
        return (cpu_seconds(pid) - before) / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--syncs", default="0.05/0.05,0.05/0.01,0.02/0.02",
        help="sync_s/load_sync_s pairs, comma-separated",
    )  # fmt: skip
    args = parser.parse_args()
    with sims() as urls:
        alone = idle_cpu(urls, {}, args.seconds)
        print(f"no state.url                      {alone * 100:5.1f}% of a core")
        for pair in args.syncs.split(","):
            sync_s, load_sync_s = (float(s) for s in pair.split("/"))
            state = {"sync_s": sync_s, "load_sync_s": load_sync_s}
            with redis_server() as redis:
                used = idle_cpu(urls, {"url": redis.url, **state}, args.seconds)
            print(f"sync_s {sync_s:g}, load_sync_s {load_sync_s:<6g} {used * 100:5.1f}% of a core"
                  f"  ({used / alone:.2f}x the unshared gateway's)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
