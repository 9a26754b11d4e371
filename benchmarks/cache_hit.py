"""What a request answered from the response cache costs at the gateway: one deterministic
chat request asked again and again through a gateway with `cache.enabled`, beside the same
request through the same gateway with the cache off and sent to the worker, in one run.

    .venv/bin/python benchmarks/cache_hit.py [--requests 1000]

One sim worker, two gateways before it (cache on, cache off), one client on one keep-alive
connection each, sequential: per request latency p50 and p99 of each, and the cached path's
against the uncached one's (a ratio). The cached path's latency is all the gateway's (nothing
else is asked); the issue's goal is under 1 ms.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

from harness import PY, drain, gateway, process, read_until, wait_http

MODEL = "cache-8b"
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "2 + 2?"}],
                   "max_tokens": 8, "temperature": 0}).encode()  # fmt: skip


def latencies(url: str, n: int) -> list[float]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    headers = {"content-type": "application/json"}
    out = []
    for _ in range(n):
        sent = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", BODY, headers)
        response = conn.getresponse()
        response.read()
        out.append(time.perf_counter() - sent)
        if response.status != 200:
            raise SystemExit(f"{url} answered {response.status}")
    conn.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    with ExitStack() as stack:
        sim = stack.enter_context(process(
            [PY, "-m", "fleetgate", "worker", "sim", "--port", "0", "--model", MODEL]
        ))  # fmt: skip
        worker = read_until(sim, r"on (http://127\.0\.0\.1:\d+)").group(1)
        drain(sim)
        wait_http(worker + "/health")
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        urls = {}
        for name, enabled in (("cache on, hits", True), ("cache off", False)):
            config = workdir / f"{enabled}.yaml"
            config.write_text(json.dumps({
                "pools": [{"model": MODEL, "backends": [{"url": worker}]}],
                "cache": {"enabled": enabled}, "request_log": {"enabled": False},
            }))  # fmt: skip
            urls[name] = stack.enter_context(gateway(config))[0]
        for url in urls.values():
            latencies(url, 50)  # warm: connections, and the first answer kept
        results: dict[str, list[float]] = {name: [] for name in urls}
        for _ in range(2):  # alternately, so both meet the same machine
            for name, url in urls.items():
                results[name] += latencies(url, args.requests // 2)
    base = statistics.median(results["cache off"])
    for name, values in results.items():
        values.sort()
        p50, p99 = statistics.median(values), values[int(len(values) * 0.99)]
        print(f"{name:16s} p50 {p50 * 1e3:7.3f} ms  p99 {p99 * 1e3:7.3f} ms  "
              f"({p50 / base:.2f}x the uncached p50)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
