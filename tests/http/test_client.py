"""The pooled HTTP client against fleetgate's own server on real localhost sockets.

Every wait is on an event or a read, with `asyncio.wait_for` only as a guard against a hang.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from fleetgate.http.client import HttpClient, Origin
from fleetgate.http.errors import (
    ConnectError,
    LocalExhaustion,
    ProtocolError,
    ReadError,
    UpstreamError,
    UpstreamTimeout,
)
from fleetgate.http.response import _READ_HIGH_WATER, UpstreamResponse
from fleetgate.http.server import HttpConnection, HttpServer, Request, start_server
from fleetgate.http.writer import ResponseWriter
from fleetgate.openai_api import send_error

GUARD_S = 5.0
Handler = Callable[[Request, ResponseWriter], Awaitable[None]]


class Upstream:
    """A server for the client to talk to, which records the connections its requests came on."""

    def __init__(self) -> None:
        self.server: HttpServer | None = None
        self.requests: list[Request] = []
        self.connections: list[HttpConnection] = []  # the connection each request came on

    @property
    def origin(self) -> Origin:
        assert self.server is not None
        return Origin.parse(f"http://127.0.0.1:{self.server.port}")

    def note(self, request: Request, writer: ResponseWriter) -> None:
        self.requests.append(request)
        self.connections.append(writer._conn)  # the server side of the client's connection

    @property
    def connection_count(self) -> int:
        return len(set(self.connections))


StartUpstream = Callable[[Handler], Awaitable[Upstream]]


def endless_stream(cancelled: asyncio.Event) -> Handler:
    """A handler that streams one token and then never ends; `cancelled` is set when the
    client's going away cancels it."""
    never = asyncio.Event()

    async def generating(request: Request, writer: ResponseWriter) -> None:
        writer.start(200, [])
        writer.write(b"token")
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    return generating


class Sink:
    """A relay sink that hands each chunk of a read to a function when the read is flushed."""

    def __init__(self, on_chunk: Callable[[bytes], object]) -> None:
        self._on_chunk = on_chunk
        self.pending: list[bytes] = []

    def flush(self) -> None:
        chunks = list(self.pending)
        self.pending.clear()
        for chunk in chunks:
            self._on_chunk(chunk)


class Flood:
    """A handler that writes 64 KiB blocks until its writer reports `paused` (or 16 MiB went),
    then waits for the reader to catch up and ends with `tail`."""

    BLOCK = bytes(range(256)) * 256
    CAP = 256 * len(BLOCK)

    def __init__(self, tail: bytes = b"") -> None:
        self.tail = tail
        self.sent = 0
        self.paused = asyncio.Event()

    async def __call__(self, request: Request, writer: ResponseWriter) -> None:
        writer.start(200, [])
        while not writer.paused and self.sent < self.CAP:
            writer.write(self.BLOCK)
            self.sent += len(self.BLOCK)
        self.paused.set()
        await writer.drain()  # returns once the client reads again
        writer.end(self.tail)

    def body(self) -> bytes:
        """What it sent, as the client should read it."""
        return self.BLOCK * (self.sent // len(self.BLOCK)) + self.tail


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    http = HttpClient(connect_timeout_s=GUARD_S)
    yield http
    await http.close()


@pytest.fixture
async def upstream() -> AsyncIterator[StartUpstream]:
    """`await upstream(handler)`: a server whose handler records each request, then runs."""
    started: list[HttpServer] = []

    async def start(handler: Handler) -> Upstream:
        up = Upstream()

        async def recording(request: Request, writer: ResponseWriter) -> None:
            up.note(request, writer)
            await handler(request, writer)

        up.server = await start_server(recording, send_error, "127.0.0.1", 0)
        started.append(up.server)
        return up

    yield start
    for server in started:
        server.abort()
        await server.server.wait_closed()


async def ok(request: Request, writer: ResponseWriter) -> None:
    writer.send(200, [(b"Content-Type", b"text/plain")], b"ok " + request.path)


async def get(client: HttpClient, up: Upstream, path: bytes) -> UpstreamResponse:
    return await asyncio.wait_for(client.request(up.origin, b"GET", path, []), GUARD_S)


async def test_sequential_requests_reuse_one_kept_alive_connection(
    client: HttpClient, upstream: StartUpstream
) -> None:
    up = await upstream(ok)
    for i in range(5):
        response = await get(client, up, b"/r%d" % i)
        assert response.status == 200
        assert await response.read() == b"ok /r%d" % i
    assert len(up.requests) == 5
    assert up.connection_count == 1


async def test_concurrent_requests_open_connections_that_are_then_reused(
    client: HttpClient, upstream: StartUpstream
) -> None:
    all_arrived = asyncio.Event()

    async def gathered(request: Request, writer: ResponseWriter) -> None:
        if len(up.requests) % 3 == 0:
            all_arrived.set()
        await all_arrived.wait()  # all three of a round in flight at once
        writer.send(200, [], b"")

    up = await upstream(gathered)

    async def one(path: bytes) -> bytes:
        return await (await get(client, up, path)).read()

    await asyncio.wait_for(asyncio.gather(one(b"/a"), one(b"/b"), one(b"/c")), GUARD_S)
    assert up.connection_count == 3
    all_arrived.clear()
    await asyncio.wait_for(asyncio.gather(one(b"/d"), one(b"/e"), one(b"/f")), GUARD_S)
    assert up.connection_count == 3  # the second round rode the pooled ones


async def test_the_request_is_written_as_http_1_1(
    client: HttpClient, upstream: StartUpstream
) -> None:
    up = await upstream(ok)
    origin = Origin.parse(f"http://127.0.0.1:{up.origin.port}/api/")
    body = b'{"model": "m"}'
    headers = [(b"content-type", b"application/json"), (b"x-request-id", b"r1")]
    response = await client.request(origin, b"POST", b"/v1/chat?x=1", headers, body)
    assert await response.read() == b"ok /api/v1/chat"
    await (await client.request(origin, b"GET", b"/v1/models", [])).read()
    await (await client.request(origin, b"DELETE", b"/v1/x", [])).read()
    post, get_, delete = up.requests
    assert (post.method, post.path, post.query, post.body) == (
        b"POST",
        b"/api/v1/chat",
        b"x=1",
        body,
    )
    assert post.headers[b"host"] == b"127.0.0.1:%d" % origin.port
    assert post.headers[b"content-length"] == b"%d" % len(body)
    assert post.headers[b"x-request-id"] == b"r1"
    assert b"content-length" not in get_.headers  # a bodiless GET has no framing header
    assert delete.headers[b"content-length"] == b"0"  # other methods say their body is empty


async def test_response_status_and_headers(client: HttpClient, upstream: StartUpstream) -> None:
    async def handler(request: Request, writer: ResponseWriter) -> None:
        writer.send(429, [(b"Retry-After", b"3"), (b"X-Model", b"m")], b"slow down")

    up = await upstream(handler)
    response = await get(client, up, b"/")
    assert response.status == 429
    assert response.header(b"retry-after") == b"3"  # names are lower-cased
    assert response.header(b"x-model") == b"m"
    assert response.header(b"x-absent") is None
    assert await response.read() == b"slow down"


async def test_a_stream_is_relayed_chunk_by_chunk(
    client: HttpClient, upstream: StartUpstream
) -> None:
    first_received = asyncio.Event()
    last_written = asyncio.Event()

    async def stream(request: Request, writer: ResponseWriter) -> None:
        if request.path == b"/next":
            await ok(request, writer)
            return
        writer.start(200, [(b"content-type", b"text/event-stream")])
        writer.write(b"data: 1\n\n")
        await first_received.wait()
        writer.write(b"data: 2\n\n")
        writer.write(b"data: [DONE]\n\n")
        last_written.set()
        writer.end()

    up = await upstream(stream)
    response = await get(client, up, b"/v1/chat/completions")
    assert response.header(b"transfer-encoding") == b"chunked"
    chunks = response.chunks()
    first = await asyncio.wait_for(anext(chunks), GUARD_S)
    assert first == b"data: 1\n\n"
    assert not last_written.is_set()  # the client had it before the server wrote the rest
    first_received.set()
    rest = [chunk async for chunk in chunks]
    assert b"".join(rest) == b"data: 2\n\ndata: [DONE]\n\n"
    # The stream ended cleanly, so its connection serves the next request.
    assert await (await get(client, up, b"/next")).read() == b"ok /next"
    assert up.connection_count == 1


async def test_relay_hands_each_chunk_to_the_sink_as_it_arrives(
    client: HttpClient, upstream: StartUpstream
) -> None:
    first_relayed = asyncio.Event()
    rest_written = asyncio.Event()

    async def stream(request: Request, writer: ResponseWriter) -> None:
        writer.start(200, [])
        writer.write(b"one")
        await first_relayed.wait()
        writer.write(b"two")
        writer.write(b"three")
        rest_written.set()
        writer.end()

    up = await upstream(stream)
    response = await get(client, up, b"/")
    relayed: list[bytes] = []
    rest_written_at_first: list[bool] = []

    def sink(chunk: bytes) -> None:
        if not relayed:
            rest_written_at_first.append(rest_written.is_set())
            first_relayed.set()
        relayed.append(chunk)

    await asyncio.wait_for(response.relay(Sink(sink)), GUARD_S)
    assert rest_written_at_first == [False]
    assert b"".join(relayed) == b"onetwothree"
    assert relayed[0] == b"one"


async def test_relay_raises_when_the_upstream_breaks_off(
    client: HttpClient, upstream: StartUpstream
) -> None:
    async def crash(request: Request, writer: ResponseWriter) -> None:
        writer.start(200, [])
        writer.write(b"partial")
        writer.abort()

    up = await upstream(crash)
    response = await get(client, up, b"/")
    relayed: list[bytes] = []
    with pytest.raises(ReadError):
        await asyncio.wait_for(response.relay(Sink(relayed.append)), GUARD_S)
    assert b"".join(relayed) in (b"", b"partial")  # whatever arrived before the cut


async def test_a_sink_that_pauses_reading_pauses_the_server(
    client: HttpClient, upstream: StartUpstream
) -> None:
    flood = Flood()
    up = await upstream(flood)
    response = await get(client, up, b"/big")
    relayed: list[bytes] = []
    behind = True

    def sink(chunk: bytes) -> None:
        relayed.append(chunk)
        if behind:
            response.pause_reading()  # as the gateway does when its own client falls behind

    relaying = asyncio.create_task(response.relay(Sink(sink)))
    await asyncio.wait_for(flood.paused.wait(), GUARD_S)
    assert flood.sent < Flood.CAP  # the pause reached the server
    assert sum(map(len, relayed)) < flood.sent
    behind = False
    response.resume_reading()
    await asyncio.wait_for(relaying, GUARD_S)
    assert b"".join(relayed) == flood.body()


async def test_a_relay_started_late_takes_the_buffered_body_and_reads_on(
    client: HttpClient, upstream: StartUpstream
) -> None:
    # Unread, the body fills the response's buffer and the socket is paused; a relay that
    # starts then gets what was buffered and the rest, instead of waiting on a paused socket.
    flood = Flood(tail=b"tail")
    up = await upstream(flood)
    response = await get(client, up, b"/big")
    await asyncio.wait_for(flood.paused.wait(), GUARD_S)
    assert flood.sent < Flood.CAP  # the unread body paused the socket
    for _ in range(int(GUARD_S / 0.01)):  # until the client has buffered its fill and paused
        if response._buffered >= _READ_HIGH_WATER:
            break
        await asyncio.sleep(0.01)
    assert response._buffered >= _READ_HIGH_WATER
    relayed: list[bytes] = []
    await asyncio.wait_for(response.relay(Sink(relayed.append)), GUARD_S)
    assert b"".join(relayed) == flood.body()


async def test_cancelling_a_relay_aborts_the_upstream_request(
    client: HttpClient, upstream: StartUpstream
) -> None:
    cancelled = asyncio.Event()
    up = await upstream(endless_stream(cancelled))
    response = await get(client, up, b"/")
    got_token = asyncio.Event()
    relaying = asyncio.create_task(response.relay(Sink(lambda chunk: got_token.set())))
    await asyncio.wait_for(got_token.wait(), GUARD_S)
    relaying.cancel()
    with pytest.raises(asyncio.CancelledError):
        await relaying
    await asyncio.wait_for(cancelled.wait(), GUARD_S)


async def test_a_reader_that_stops_pauses_the_server(
    client: HttpClient, upstream: StartUpstream
) -> None:
    # Not reading makes the client pause its socket, so the server's writes back up until its
    # writer reports `paused`; nothing is lost when reading resumes.
    flood = Flood(tail=b"tail")
    up = await upstream(flood)
    response = await get(client, up, b"/big")
    chunks = response.chunks()
    received = [await asyncio.wait_for(anext(chunks), GUARD_S)]
    await asyncio.wait_for(flood.paused.wait(), GUARD_S)
    assert flood.sent < Flood.CAP  # it paused: the loop did not run to its cap
    received += [chunk async for chunk in chunks]
    assert b"".join(received) == flood.body()


async def test_a_closed_port_is_a_connect_error(client: HttpClient) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free now, and nothing listens on it once closed
    with pytest.raises(ConnectError, match="cannot connect: Connection refused"):
        await client.request(Origin.parse(f"127.0.0.1:{port}"), b"GET", b"/", [])


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS])
async def test_the_gateway_out_of_sockets_is_not_a_connect_error(
    client: HttpClient, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    async def exhausted(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(asyncio.get_running_loop(), "create_connection", exhausted)
    with pytest.raises(LocalExhaustion, match=os.strerror(code)) as info:
        await client.request(Origin.parse("127.0.0.1:9"), b"GET", b"/", [])
    assert not isinstance(info.value, ConnectError)


async def test_a_server_that_aborts_mid_body_is_a_read_error(
    client: HttpClient, upstream: StartUpstream
) -> None:
    headers_seen = asyncio.Event()

    async def crash(request: Request, writer: ResponseWriter) -> None:
        if request.path == b"/after":
            await ok(request, writer)
            return
        writer.start(200, [])
        writer.write(b"partial")
        await headers_seen.wait()
        writer.abort()

    up = await upstream(crash)
    response = await get(client, up, b"/crash")
    assert response.status == 200
    headers_seen.set()
    chunks = response.chunks()
    assert await asyncio.wait_for(anext(chunks), GUARD_S) == b"partial"
    with pytest.raises(ReadError, match="upstream closed the connection"):
        await asyncio.wait_for(anext(chunks), GUARD_S)
    # The broken connection is not pooled: the next request gets a fresh one.
    assert await (await get(client, up, b"/after")).read() == b"ok /after"
    assert up.connection_count == 2


async def test_a_server_that_aborts_before_answering_is_a_read_error(
    client: HttpClient, upstream: StartUpstream
) -> None:
    async def crash(request: Request, writer: ResponseWriter) -> None:
        writer.abort()

    up = await upstream(crash)
    with pytest.raises(ReadError):
        await get(client, up, b"/")
    assert len(up.requests) == 1  # a fresh connection is not retried


async def test_a_stale_pooled_connection_is_replaced_transparently(
    client: HttpClient, upstream: StartUpstream
) -> None:
    writers: list[ResponseWriter] = []

    async def handler(request: Request, writer: ResponseWriter) -> None:
        writers.append(writer)
        await ok(request, writer)

    up = await upstream(handler)
    assert await (await get(client, up, b"/first")).read() == b"ok /first"
    # The server drops the idle kept-alive connection (a restart, an idle timeout), and the
    # next request follows at once: the client finds the pooled connection closed, or learns it
    # by a ReadError on sending, and either way opens a new one without failing the request.
    writers[0].abort()
    response = await get(client, up, b"/second")
    assert await response.read() == b"ok /second"
    assert [r.path for r in up.requests] == [b"/first", b"/second"]  # sent once, not twice
    assert up.connection_count == 2


async def test_a_connection_close_response_is_not_reused(
    client: HttpClient, upstream: StartUpstream
) -> None:
    up = await upstream(ok)
    close = [(b"connection", b"close")]
    for _ in range(2):
        response = await client.request(up.origin, b"GET", b"/", close)
        assert await response.read() == b"ok /"
    assert up.connection_count == 2


async def test_closing_a_response_mid_stream_cancels_the_upstream_handler(
    client: HttpClient, upstream: StartUpstream
) -> None:
    cancelled = asyncio.Event()
    up = await upstream(endless_stream(cancelled))
    response = await get(client, up, b"/")
    assert await asyncio.wait_for(anext(response.chunks()), GUARD_S) == b"token"
    response.close()  # the gateway's own client went away
    await asyncio.wait_for(cancelled.wait(), GUARD_S)
    with pytest.raises(ReadError):
        await anext(response.chunks())


async def test_cancelling_a_reader_aborts_the_upstream_request(
    client: HttpClient, upstream: StartUpstream
) -> None:
    cancelled = asyncio.Event()
    streaming = asyncio.Event()
    never = asyncio.Event()

    async def generating(request: Request, writer: ResponseWriter) -> None:
        writer.start(200, [])
        writer.write(b"token")
        streaming.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    up = await upstream(generating)
    response = await get(client, up, b"/")
    reading = asyncio.create_task(response.read())
    await asyncio.wait_for(streaming.wait(), GUARD_S)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    await asyncio.wait_for(cancelled.wait(), GUARD_S)


async def test_a_broken_chunked_body_is_a_protocol_error(client: HttpClient) -> None:
    hung_up = asyncio.Event()

    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        writer.write(b"not-a-size\r\n")
        await writer.drain()
        await reader.read()  # until the client drops the connection over the bad chunk
        hung_up.set()

    server = await asyncio.start_server(broken, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        response = await client.request(Origin.parse(f"127.0.0.1:{port}"), b"GET", b"/", [])
        await asyncio.wait_for(hung_up.wait(), GUARD_S)
        chunks = response.chunks()
        assert await anext(chunks) == b"abc"
        with pytest.raises(ProtocolError, match="invalid HTTP from upstream"):
            await anext(chunks)
    finally:
        server.close()


async def test_an_upstream_that_is_not_http_is_a_protocol_error(client: HttpClient) -> None:
    async def babble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()

    server = await asyncio.start_server(babble, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ProtocolError, match="invalid HTTP from upstream"):
            await client.request(Origin.parse(f"127.0.0.1:{port}"), b"GET", b"/", [])
    finally:
        server.close()
    assert issubclass(ProtocolError, UpstreamError)


@pytest.mark.parametrize(
    ("url", "fields", "text"),
    [
        ("http://10.0.0.5:8000", ("http", "10.0.0.5", 8000, b""), "http://10.0.0.5:8000"),
        ("127.0.0.1:8101", ("http", "127.0.0.1", 8101, b""), "http://127.0.0.1:8101"),
        ("http://vllm", ("http", "vllm", 80, b""), "http://vllm:80"),
        (
            "https://api.example.com",
            ("https", "api.example.com", 443, b""),
            "https://api.example.com:443",
        ),
        ("http://h:9/v1/", ("http", "h", 9, b"/v1"), "http://h:9/v1"),
        ("HTTP://Box.Local:81/a/b", ("http", "box.local", 81, b"/a/b"), "http://box.local:81/a/b"),
    ],
)
def test_origin_parse(url: str, fields: tuple[str, str, int, bytes], text: str) -> None:
    origin = Origin.parse(url)
    assert (origin.scheme, origin.host, origin.port, origin.base_path) == fields
    assert origin.host_header == f"{origin.host}:{origin.port}".encode()
    assert str(origin) == text
    assert Origin.parse(str(origin)) == origin  # str() gives back a URL of the same origin


@pytest.mark.parametrize(
    "url", ["ftp://files.example.com", "http://", "://nohost", "http://h:port", "http://h:70000"]
)
def test_origin_parse_rejects_what_is_not_an_http_url(url: str) -> None:
    with pytest.raises(ValueError, match=r"URL|[Pp]ort"):
        Origin.parse(url)


def test_an_ipv6_origin_brackets_its_host() -> None:
    origin = Origin.parse("http://[::1]:8000")
    assert origin.host == "::1"  # what the socket connects to
    assert origin.host_header == b"[::1]:8000"
    assert str(origin) == "http://[::1]:8000"


async def test_a_connection_paused_at_the_end_of_a_stream_is_reused_unpaused(
    client: HttpClient, upstream: StartUpstream
) -> None:
    """A reader that fell behind pauses the socket; the next request must not inherit that."""

    async def answer(request: Request, writer: ResponseWriter) -> None:
        writer.start(200, [])
        writer.write(b"x" * 10)
        writer.end(b"last")

    up = await upstream(answer)
    first = await client.request(up.origin, b"GET", b"/", [])
    paused = asyncio.Event()

    def slow_sink(chunk: bytes) -> None:
        first.pause_reading()  # as the stream relay does when its client is slow
        paused.set()

    await asyncio.wait_for(first.relay(Sink(slow_sink)), GUARD_S)
    assert paused.is_set()
    second = await asyncio.wait_for(client.request(up.origin, b"GET", b"/", []), GUARD_S)
    assert await asyncio.wait_for(second.read(), GUARD_S) == b"x" * 10 + b"last"
    first.resume_reading()  # late callbacks of the old reader must not touch the reused socket
    assert up.connection_count == 1


async def test_an_interim_1xx_answer_is_skipped(client: HttpClient) -> None:
    async def raw(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-final: 1\r\n\r\nok"
        )
        await writer.drain()

    server = await asyncio.start_server(raw, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        response = await client.request(Origin.parse(f"http://127.0.0.1:{port}"), b"GET", b"/", [])
        assert response.status == 200
        assert response.header(b"x-final") == b"1"
        assert response.header(b"link") is None
        assert await asyncio.wait_for(response.read(), GUARD_S) == b"ok"


async def test_a_total_deadline_fails_a_response_that_does_not_finish(
    client: HttpClient, upstream: StartUpstream
) -> None:
    never = asyncio.Event()

    async def slow(request: Request, writer: ResponseWriter) -> None:
        writer.start(200, [])
        writer.write(b"begun")
        await never.wait()

    up = await upstream(slow)
    response = await client.request(up.origin, b"GET", b"/", [])
    response.expire_in(0.05, "too slow")
    with pytest.raises(UpstreamTimeout, match="too slow"):
        await asyncio.wait_for(response.read(), GUARD_S)


async def test_a_first_byte_timeout_fails_a_silent_upstream(
    client: HttpClient, upstream: StartUpstream
) -> None:
    never = asyncio.Event()

    async def silent(request: Request, writer: ResponseWriter) -> None:
        await never.wait()

    up = await upstream(silent)
    with pytest.raises(UpstreamTimeout, match="first-byte"):
        await asyncio.wait_for(client.request(up.origin, b"GET", b"/", [], timeout_s=0.05), GUARD_S)
