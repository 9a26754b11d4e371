"""Bad input over raw HTTP: every mistake gets the right 4xx in OpenAI's error shape, and none
of them crashes the gateway, leaks a connection, or leaves a request counted in flight."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.procs import gateway, get, metric, sim_workers, write_config

MODEL = "sim-8b"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with sim_workers(MODEL, 1) as workers:
        path = tmp_path_factory.mktemp("gw") / "gw.yaml"
        config = write_config(path, {MODEL: workers}, max_body_bytes=20_000)
        with gateway(["--config", str(config)]) as (url, _):
            yield url, workers[0]


def post(url: str, path: str, body: bytes, method: str = "POST") -> tuple[int, dict[str, object]]:
    host, port = url[7:].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request(method, path, body=body, headers={"content-type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, json.loads(data)


def assert_openai_error(body: dict[str, object], param: str | None = None) -> str:
    assert set(body) == {"error"}
    error = body["error"]
    assert isinstance(error, dict)
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    message = error["message"]
    assert isinstance(message, str) and len(message) > 10
    return message


CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "says"),
    [
        (CHAT, b"{not json", 400, None, "JSON"),
        (CHAT, b"[1, 2]", 400, None, "object"),
        (CHAT, b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model", "model"),
        (CHAT, b'{"model": "sim-8b"}', 400, "messages", "messages"),
        (CHAT, b'{"model": 7, "messages": []}', 400, "model", "str"),
        (CHAT, b'{"model": "sim-8b", "messages": "hi"}', 400, "messages", "array"),
        (CHAT, b'{"model": "sim-8b", "messages": []}', 400, "messages", "non-empty"),
        (CHAT, b'{"model": "sim-8b", "messages": [{}], "stream": "yes"}', 400, "stream", "bool"),
        (CHAT, b'{"model": "m", "messages": [{}], "max_tokens": "9"}', 400, "max_tokens", "int"),
        ("/v1/completions", b'{"model": "sim-8b"}', 400, "prompt", "prompt"),
        ("/v1/embeddings", b'{"model": "sim-8b"}', 400, "input", "input"),
        (CHAT, b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404,
         "model", "sim-8b"),
        ("/v1/nothing", b"{}", 404, None, "/v1/chat/completions"),
        (CHAT, b'{"model": "sim-8b", "messages": [{"role": "user", "content": "\xff"}]}', 400,
         None, "UTF-8"),
        (CHAT, b'{"model": "sim-\xff", "messages": [{"role": "user", "content": "x"}]}', 400,
         None, "UTF-8"),
        (CHAT, b'{"model": "sim-8b", "messages": [{"role": "user", "content": %b}]}'
         % (b"[" * 1000 + b"]" * 1000), 400, None, "levels deep"),
    ],
)  # fmt: skip
def test_bad_bodies_get_a_clear_4xx(
    fleet: tuple[str, str], path: str, body: bytes, status: int, param: str | None, says: str
) -> None:
    got, error = post(fleet[0], path, body)
    assert got == status
    assert says in assert_openai_error(error, param)


def test_body_over_the_limit_is_413(fleet: tuple[str, str]) -> None:
    big = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 30_000}]})
    status, error = post(fleet[0], CHAT, big.encode())
    assert status == 413
    assert "smaller" in assert_openai_error(error)


def test_wrong_method_is_405(fleet: tuple[str, str]) -> None:
    status, error = post(fleet[0], CHAT, b"", method="GET")
    assert status == 405
    assert "POST" in assert_openai_error(error)


def test_garbage_http_gets_400_and_the_connection_closed(fleet: tuple[str, str]) -> None:
    host, port = fleet[0][7:].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"HELLO THERE\r\n\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400")
    assert b'"error"' in data
    assert b"x-request-id: " in data  # even what never became a request gets an id


def test_client_disconnect_mid_stream_cancels_the_upstream(fleet: tuple[str, str]) -> None:
    url, worker = fleet
    host, port = url[7:].split(":")
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "long"}],
                       "max_tokens": 5000, "stream": True}).encode()  # fmt: skip
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (len(body), body)
        )
        received = b""
        while received.count(b"data:") < 3:
            received += sock.recv(4096)
        assert metric(worker, "vllm:num_requests_running") == 1
    deadline = time.monotonic() + 5
    while metric(worker, "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "the worker kept generating for a gone client"
        time.sleep(0.05)
    while metric(url, "fleetgate_backend_in_flight_requests") != 0:
        assert time.monotonic() < deadline, "the gateway still counts the request in flight"
        time.sleep(0.05)
    assert metric(url, "fleetgate_requests_total", status="499") == 1  # not counted as a 200


def test_still_serving_after_all_that(fleet: tuple[str, str], tmp_path: Path) -> None:
    ok = b'{"model": "sim-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}'
    status, body = post(fleet[0], CHAT, ok)
    assert status == 200 and body["choices"]
    assert get(fleet[0] + "/healthz")[0] == 200
    assert metric(fleet[0], "fleetgate_backend_in_flight_requests") == 0
    assert metric(fleet[0], "fleetgate_backend_pending_prefill_tokens") == 0
    assert metric(fleet[0], "fleetgate_backend_in_flight_tokens") == 0
    # The gateway's own answers are counted too, without the client's model string.
    assert metric(fleet[0], "fleetgate_requests_total", backend="none", status="400") >= 10
    assert metric(fleet[0], "fleetgate_requests_total", backend="none", status="404") >= 1


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_large_bodies_on_closed_connections_leave_memory_flat(tmp_path: Path) -> None:
    """Each connection that closes must give back its last body at once: the gateway collects
    cycles rarely (runtime.py), so one kept by a cycle would stay (45 MB -> 1.1 GB seen)."""
    big = 4 * 1024 * 1024
    config = write_config(tmp_path / "gw.yaml", {MODEL: ["http://127.0.0.1:9"]},
                          max_body_bytes=2 * big)  # fmt: skip
    body = b'{"model": "elsewhere", "messages": [{"role": "user", "content": "%b"}]}' % (b"x" * big)
    with gateway(["--config", str(config)]) as (url, proc):
        for _ in range(5):  # warm up: the allocator's arenas, the first connections
            assert post(url, CHAT, body)[0] == 404
        before = rss_bytes(proc.popen.pid)
        for _ in range(100):
            assert post(url, CHAT, body)[0] == 404  # each on its own connection
        grown = rss_bytes(proc.popen.pid) - before
    assert grown < 60 * 1024 * 1024, f"RSS grew {grown / 2**20:.0f} MB over 100 bodies of 4 MB"
