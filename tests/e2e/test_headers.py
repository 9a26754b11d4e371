"""Headers through a real gateway process: what a client sends reaches the backend but for the
hop-by-hop ones, the client's credentials and the denied; what the backend answers reaches the
client but for the hop-by-hop ones. The backend is a recording HTTP server in this process."""

from __future__ import annotations

import http.client
import http.server
import json
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest

from tests.e2e.procs import gateway, write_config

MODEL = "echo-1b"
ANSWER = b'{"id":"c1","object":"chat.completion","choices":[]}'


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every POST with ANSWER and headers of its own; keeps what each POST carried."""

    seen: ClassVar[list[dict[str, str]]] = []
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # the gateway's health check
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        Recorder.seen.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(200)
        for name, value in (
            ("content-type", "application/json"), ("content-length", str(len(ANSWER))),
            ("openai-processing-ms", "41"), ("x-ratelimit-remaining-tokens", "100"),
            ("keep-alive", "timeout=5"), ("x-request-id", "the-backend-s"),
        ):  # fmt: skip
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        backend = f"http://127.0.0.1:{upstream.server_address[1]}"
        path = tmp_path_factory.mktemp("gw") / "gw.yaml"
        config = write_config(path, {MODEL: [backend]})  # the default deny list
        with gateway(["--config", str(config)]) as (url, _):
            yield url
    finally:
        upstream.shutdown()


def test_headers_cross_the_gateway_each_way_but_hop_by_hop_and_credentials(gw: str) -> None:
    host, port = gw[7:].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    conn.request("POST", "/v1/chat/completions", body, {
        "content-type": "application/json", "authorization": "Bearer sk-client",
        "cookie": "session=1", "x-api-key": "sk-2", "connection": "x-hop",
        "x-hop": "1", "proxy-authorization": "Basic x", "x-fleetgate-total-timeout-s": "30",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "openai-organization": "org-1", "x-custom": "kept",
    })  # fmt: skip
    response = conn.getresponse()
    assert (response.status, response.read()) == (200, ANSWER)
    got = {k.lower(): v for k, v in response.getheaders()}
    conn.close()
    sent = Recorder.seen[-1]
    for kept in ("traceparent", "openai-organization", "x-custom"):
        assert kept in sent, sent
    for dropped in ("authorization", "cookie", "x-api-key", "x-hop",
                    "proxy-authorization", "x-fleetgate-total-timeout-s",
                    "accept-encoding"):  # fmt: skip
        assert dropped not in sent, sent
    assert sent["x-request-id"] != "the-backend-s"  # the gateway's id, not anyone else's
    assert (got["openai-processing-ms"], got["x-ratelimit-remaining-tokens"]) == ("41", "100")
    assert "keep-alive" not in got
    assert got["x-request-id"] == sent["x-request-id"]  # the gateway's, as it sent it
