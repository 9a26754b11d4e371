"""An OTLP/HTTP traces receiver that accepts and drops every export, for benchmarks that run
the gateway with tracing on (overhead.py --pair tracing); counts what it got.

    .venv/bin/python benchmarks/otlp_sink.py --port PORT
"""

from __future__ import annotations

import argparse
import http.server


class _Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    exports = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        type(self).exports += 1
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        body = b"%d\n" % type(self).exports
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    http.server.ThreadingHTTPServer(("127.0.0.1", args.port), _Sink).serve_forever()


if __name__ == "__main__":
    main()
