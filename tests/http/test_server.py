"""The HTTP/1.1 server on a real localhost socket, spoken to byte by byte.

Every wait is on an event or a read, with `asyncio.wait_for` only as a guard against a hang.
"""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from fleetgate.http.server import HttpServer, Request, ServerLimits, start_server
from fleetgate.http.writer import ResponseWriter
from fleetgate.openai_api import send_error

GUARD_S = 5.0
Handler = Callable[[Request, ResponseWriter], Awaitable[None]]
Serve = Callable[..., Awaitable[HttpServer]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """`await serve(handler, limits=None)`: a server on 127.0.0.1 and a free port."""
    servers: list[HttpServer] = []

    async def start(handler: Handler, limits: ServerLimits | None = None) -> HttpServer:
        server = await start_server(handler, send_error, "127.0.0.1", 0, limits)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.abort()
        await server.server.wait_closed()


async def connect(
    server: HttpServer,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes], bytes]:
    """One response: status, headers (lower-case names), body (de-chunked)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD_S)
    status_line, *lines = head[:-4].split(b"\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if headers.get(b"transfer-encoding") == b"chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            body += await reader.readexactly(size)
            assert await reader.readexactly(2) == b"\r\n"
        assert await reader.readexactly(2) == b"\r\n"
    else:
        body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
    return int(status_line.split()[1]), headers, body


async def echo(request: Request, writer: ResponseWriter) -> None:
    """Answers with what it was sent: method, path, query and body."""
    writer.send(
        200,
        [(b"content-type", b"text/plain")],
        b"%b %b?%b %b" % (request.method, request.path, request.query, request.body),
    )


async def test_a_request_reaches_the_handler_parsed(serve: Serve) -> None:
    seen: list[Request] = []

    async def handler(request: Request, writer: ResponseWriter) -> None:
        seen.append(request)
        writer.send(201, [(b"x-answer", b"42")], b"made")

    server = await serve(handler)
    reader, writer = await connect(server)
    writer.write(
        b"POST /v1/chat/completions?x=1&y=2 HTTP/1.1\r\nHost: gw\r\nX-Session-ID: s1\r\n"
        b'Content-Type: application/json\r\nContent-Length: 7\r\n\r\n{"a":1}'
    )
    status, headers, body = await read_response(reader)
    assert (status, headers[b"x-answer"], body) == (201, b"42", b"made")
    (request,) = seen
    assert (request.method, request.path, request.query) == (
        b"POST",
        b"/v1/chat/completions",
        b"x=1&y=2",
    )
    assert request.headers[b"x-session-id"] == b"s1"  # names are lower-cased
    assert (request.body, request.keep_alive, request.body_too_large) == (b'{"a":1}', True, False)
    writer.close()


async def test_keep_alive_serves_sequential_requests_on_one_connection(serve: Serve) -> None:
    server = await serve(echo)
    reader, writer = await connect(server)
    for i in range(3):
        writer.write(b"GET /n/%d HTTP/1.1\r\nHost: gw\r\n\r\n" % i)
        status, headers, body = await read_response(reader)
        assert (status, body) == (200, b"GET /n/%d? " % i)
        assert b"connection" not in headers
    writer.close()


async def test_pipelined_requests_are_answered_in_order_one_at_a_time(serve: Serve) -> None:
    first_started = asyncio.Event()
    release_first = asyncio.Event()
    started: list[bytes] = []

    async def handler(request: Request, writer: ResponseWriter) -> None:
        started.append(request.path)
        if request.path == b"/first":
            first_started.set()
            await release_first.wait()
        writer.send(200, [], request.path)

    server = await serve(handler)
    reader, writer = await connect(server)
    writer.write(
        b"GET /first HTTP/1.1\r\nHost: gw\r\n\r\n"
        b"POST /second HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\nhi"
        b"GET /third HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
    )
    await asyncio.wait_for(first_started.wait(), GUARD_S)
    assert started == [b"/first"]  # the others wait their turn, though already parsed
    release_first.set()
    answers = [await read_response(reader) for _ in range(3)]
    assert [body for _, _, body in answers] == [b"/first", b"/second", b"/third"]
    assert answers[2][1][b"connection"] == b"close"
    assert await asyncio.wait_for(reader.read(), GUARD_S) == b""  # then the server closes
    writer.close()


async def test_a_stream_is_sent_chunk_by_chunk_as_written(serve: Serve) -> None:
    first_read = asyncio.Event()

    async def handler(request: Request, writer: ResponseWriter) -> None:
        writer.start(200, [(b"content-type", b"text/event-stream")])
        writer.write(b"data: 1\n\n")
        writer.write(b"")  # skipped: an empty chunk would end the stream
        await writer.drain()
        await first_read.wait()
        writer.write(b"data: 2\n\n")
        writer.end()
        writer.end()  # idempotent

    server = await serve(handler)
    reader, writer = await connect(server)
    writer.write(b"GET /stream HTTP/1.1\r\nHost: gw\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD_S)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"transfer-encoding: chunked\r\n" in head
    first = await asyncio.wait_for(reader.readexactly(len(b"9\r\ndata: 1\n\n\r\n")), GUARD_S)
    assert first == b"9\r\ndata: 1\n\n\r\n"  # arrived before the handler wrote the second
    first_read.set()
    rest = await asyncio.wait_for(
        reader.readexactly(len(b"9\r\ndata: 2\n\n\r\n0\r\n\r\n")), GUARD_S
    )
    assert rest == b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"
    # The connection stays usable after a stream.
    writer.write(b"GET /again HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert (await read_response(reader))[0] == 200
    writer.close()


async def test_a_body_over_the_limit_is_dropped_and_flagged(serve: Serve) -> None:
    seen: list[Request] = []

    async def handler(request: Request, writer: ResponseWriter) -> None:
        seen.append(request)
        writer.send(413 if request.body_too_large else 200, [], b"")

    server = await serve(handler, ServerLimits(max_body_bytes=10))
    reader, writer = await connect(server)
    writer.write(b"POST /a HTTP/1.1\r\nHost: gw\r\nContent-Length: 10\r\n\r\n0123456789")
    assert (await read_response(reader))[0] == 200
    writer.write(b"POST /b HTTP/1.1\r\nHost: gw\r\nContent-Length: 11\r\n\r\n0123456789X")
    assert (await read_response(reader))[0] == 413
    # A chunked body is counted the same way, across chunks.
    writer.write(
        b"POST /c HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"6\r\n012345\r\n6\r\n6789AB\r\n0\r\n\r\n"
    )
    assert (await read_response(reader))[0] == 413
    assert [(r.body, r.body_too_large) for r in seen] == [
        (b"0123456789", False),
        (b"", True),
        (b"", True),
    ]
    writer.close()


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", "not valid HTTP/1.1"),
        (b"GET / HTTP/1.1\r\nHost gw\r\n\r\n", "not valid HTTP/1.1"),
        (b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", "not valid HTTP/1.1"),
    ],
)
async def test_malformed_http_gets_a_400_and_the_connection_closed(
    serve: Serve, data: bytes, says: str
) -> None:
    handled = []

    async def handler(request: Request, writer: ResponseWriter) -> None:
        handled.append(request)
        writer.send(200, [], b"")

    server = await serve(handler)
    reader, writer = await connect(server)
    writer.write(data)
    status, headers, body = await read_response(reader)
    assert status == 400
    assert headers[b"connection"] == b"close"
    assert says in json.loads(body)["error"]["message"]
    assert await asyncio.wait_for(reader.read(), GUARD_S) == b""
    assert not handled
    writer.close()


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\n"
        b"Upgrade: websocket\r\nContent-Length: 2\r\n\r\n{}",
    ],
)
async def test_an_upgrade_request_gets_a_400_and_never_reaches_the_handler(
    serve: Serve, data: bytes
) -> None:
    handled = []

    async def handler(request: Request, writer: ResponseWriter) -> None:
        handled.append(request)
        writer.send(200, [], b"")

    server = await serve(handler)
    reader, writer = await connect(server)
    writer.write(data)
    response = await asyncio.wait_for(reader.read(), GUARD_S)
    writer.close()
    assert not handled
    assert response.startswith(b"HTTP/1.1 400 ")
    assert b"upgrades (HTTP/2 included) are not supported" in response


async def test_garbage_after_a_good_request_closes_after_answering_it(serve: Serve) -> None:
    server = await serve(echo)
    reader, writer = await connect(server)
    writer.write(b"GET /ok HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert (await read_response(reader))[2] == b"GET /ok? "
    writer.write(b"\x16\x03\x01 a TLS hello\r\n\r\n")
    assert (await read_response(reader))[0] == 400
    assert await asyncio.wait_for(reader.read(), GUARD_S) == b""
    writer.close()


async def test_a_client_going_away_mid_stream_cancels_the_handler(serve: Serve) -> None:
    streaming = asyncio.Event()
    cancelled = asyncio.Event()
    never = asyncio.Event()

    async def handler(request: Request, writer: ResponseWriter) -> None:
        writer.start(200, [])
        writer.write(b"token")
        streaming.set()
        try:
            await never.wait()  # an upstream that is still generating
        except asyncio.CancelledError:
            cancelled.set()
            raise

    server = await serve(handler)
    reader, writer = await connect(server)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"token\r\n"), GUARD_S)
    await asyncio.wait_for(streaming.wait(), GUARD_S)
    writer.close()
    await asyncio.wait_for(cancelled.wait(), GUARD_S)


async def test_a_failing_handler_gets_a_500_before_any_byte(serve: Serve) -> None:
    async def handler(request: Request, writer: ResponseWriter) -> None:
        raise RuntimeError("boom")

    server = await serve(handler)
    reader, writer = await connect(server)
    writer.write(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")
    status, _, body = await read_response(reader)
    assert status == 500
    assert json.loads(body)["error"]["type"] == "server_error"
    assert b"boom" not in body  # internals stay in the log
    assert await asyncio.wait_for(reader.read(), GUARD_S) == b""
    writer.close()


async def test_a_handler_that_leaves_a_stream_unfinished_closes_the_connection(
    serve: Serve,
) -> None:
    async def handler(request: Request, writer: ResponseWriter) -> None:
        writer.start(200, [])
        writer.write(b"half")

    server = await serve(handler)
    reader, writer = await connect(server)
    writer.write(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\nGET / HTTP/1.1\r\nHost: gw\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), GUARD_S)
    assert data.endswith(b"4\r\nhalf\r\n")  # no terminating chunk, no second response
    assert data.count(b"HTTP/1.1 200") == 1
    writer.close()


async def test_http_1_0_and_connection_close_end_the_connection(serve: Serve) -> None:
    server = await serve(echo)
    for request in (
        b"GET /old HTTP/1.0\r\n\r\n",
        b"GET /old HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
    ):
        reader, writer = await connect(server)
        writer.write(request)
        status, headers, body = await read_response(reader)
        assert (status, headers[b"connection"], body) == (200, b"close", b"GET /old? ")
        assert await asyncio.wait_for(reader.read(), GUARD_S) == b""
        writer.close()


async def test_close_lets_idle_connections_go_and_finishes_busy_ones(serve: Serve) -> None:
    busy_started = asyncio.Event()
    release = asyncio.Event()

    async def handler(request: Request, writer: ResponseWriter) -> None:
        if request.path == b"/busy":
            busy_started.set()
            await release.wait()
        writer.send(200, [], request.path)

    server = await serve(handler)
    port = server.port
    idle_reader, idle_writer = await connect(server)
    idle_writer.write(b"GET /idle HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert (await read_response(idle_reader))[2] == b"/idle"
    busy_reader, busy_writer = await connect(server)
    busy_writer.write(b"GET /busy HTTP/1.1\r\nHost: gw\r\n\r\n")
    await asyncio.wait_for(busy_started.wait(), GUARD_S)

    closing = asyncio.create_task(server.close())
    assert await asyncio.wait_for(idle_reader.read(), GUARD_S) == b""
    release.set()
    assert (await read_response(busy_reader))[2] == b"/busy"
    await asyncio.wait_for(closing, GUARD_S)
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)  # no longer listening
    idle_writer.close()
    busy_writer.close()


async def test_an_oversized_head_gets_a_431(serve: Serve) -> None:
    server = await serve(echo, ServerLimits(max_header_bytes=200))
    reader, writer = await connect(server)
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 300 + b"\r\n\r\n")
    status, _, body = await read_response(reader)
    assert status == 431
    assert "too large" in json.loads(body)["error"]["message"]
    assert await asyncio.wait_for(reader.read(), GUARD_S) == b""


async def test_a_request_that_never_finishes_arriving_gets_a_408(serve: Serve) -> None:
    server = await serve(echo, ServerLimits(request_timeout_s=0.2))
    reader, writer = await connect(server)
    writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc")
    status, _, body = await read_response(reader)
    assert status == 408
    assert json.loads(body)["error"]["type"] == "timeout_error"


async def test_an_idle_keep_alive_connection_is_closed(serve: Serve) -> None:
    server = await serve(echo, ServerLimits(keep_alive_timeout_s=0.2))
    reader, writer = await connect(server)
    writer.write(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n")
    assert (await read_response(reader))[0] == 200
    assert await asyncio.wait_for(reader.read(), GUARD_S) == b""  # closed by the server


async def test_many_pipelined_requests_are_all_answered_in_order(
    serve: Serve,
) -> None:
    server = await serve(echo)
    reader, writer = await connect(server)
    writer.write(b"".join(b"GET /%d HTTP/1.1\r\nhost: x\r\n\r\n" % i for i in range(20)))
    for i in range(20):
        status, _, body = await read_response(reader)
        assert status == 200
        assert body.startswith(b"GET /%d?" % i)


async def test_a_head_line_that_never_ends_gets_a_431(serve: Serve) -> None:
    server = await serve(echo, ServerLimits(max_header_bytes=1000))
    reader, writer = await connect(server)
    writer.write(b"GET / HTTP/1.1\r\nx-endless: ")
    for _ in range(10):
        writer.write(b"a" * 200)
    status, _, _ = await read_response(reader)
    assert status == 431


async def test_garbage_pipelined_behind_a_good_request_is_answered_after_it(
    serve: Serve,
) -> None:
    server = await serve(echo)
    reader, writer = await connect(server)
    writer.write(b"GET /good HTTP/1.1\r\nhost: x\r\n\r\nNOT HTTP AT ALL\r\n\r\n")
    status, _, body = await read_response(reader)
    assert status == 200
    assert body.startswith(b"GET /good?")
    status, _, _ = await read_response(reader)
    assert status == 400
    assert await asyncio.wait_for(reader.read(), GUARD_S) == b""


async def test_head_gets_the_head_without_the_body(serve: Serve) -> None:
    server = await serve(echo)
    reader, writer = await connect(server)
    writer.write(b"HEAD /x HTTP/1.1\r\nhost: x\r\n\r\nGET /y HTTP/1.1\r\nhost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD_S)
    assert head.startswith(b"HTTP/1.1 200")
    status, _, body = await read_response(reader)  # the next answer follows at once
    assert status == 200
    assert body.startswith(b"GET /y?")


async def test_expect_100_continue_is_answered(serve: Serve) -> None:
    server = await serve(echo)
    reader, writer = await connect(server)
    writer.write(
        b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n"
    )
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD_S)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"hi")
    status, _, body = await read_response(reader)
    assert status == 200
    assert body.endswith(b" hi")


async def test_a_closed_connection_is_freed_by_reference_counting_alone(serve: Serve) -> None:
    """The gateway collects garbage rarely (runtime.py), so a connection kept alive by a cycle
    would keep its last request's body for good: it must go as soon as it closes."""
    conns: list[weakref.ref[object]] = []
    freed = asyncio.Event()

    async def handler(request: Request, writer: ResponseWriter) -> None:
        conn = writer._conn  # the HttpConnection behind the writer
        conns.append(weakref.ref(conn, lambda _: freed.set()))
        writer.send(200, [], b"ok")

    server = await serve(handler)
    gc.disable()
    try:
        reader, writer = await connect(server)
        writer.write(b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 65536\r\n\r\n")
        writer.write(b"x" * 65536)
        assert (await read_response(reader))[0] == 200
        writer.close()
        await asyncio.wait_for(freed.wait(), GUARD_S)
    finally:
        gc.enable()
    assert conns[0]() is None


async def test_a_connection_over_the_limit_gets_a_503_and_is_closed(serve: Serve) -> None:
    server = await serve(echo, ServerLimits(max_connections=2))
    held = [await connect(server) for _ in range(2)]
    for reader, writer in held:  # both are served (and so surely counted)
        writer.write(b"GET /in HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert (await read_response(reader))[0] == 200
    reader, writer = await connect(server)
    status, headers, body = await read_response(reader)
    assert (status, headers[b"retry-after"]) == (503, b"1")
    assert "connections" in json.loads(body)["error"]["message"]
    assert await asyncio.wait_for(reader.read(), GUARD_S) == b""
    writer.close()
    # One goes away (closed by the server, so it has let it go before the client sees the
    # end): room for one more.
    reader, writer = held[0]
    writer.write(b"GET /bye HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
    assert (await read_response(reader))[0] == 200
    assert await asyncio.wait_for(reader.read(), GUARD_S) == b""
    reader, writer = await connect(server)
    writer.write(b"GET /again HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert (await read_response(reader))[0] == 200
    writer.close()


async def test_bodies_over_the_shared_budget_get_a_503_and_are_not_kept(serve: Serve) -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    seen: list[bytes] = []

    async def handler(request: Request, writer: ResponseWriter) -> None:
        seen.append(request.body)
        if request.path == b"/hold":
            started.set()
            await release.wait()
        writer.send(200, [], b"done")

    server = await serve(handler, ServerLimits(max_body_bytes=60, max_buffered_body_bytes=100))
    holder_reader, holder = await connect(server)
    holder.write(b"POST /hold HTTP/1.1\r\nHost: gw\r\nContent-Length: 60\r\n\r\n" + b"h" * 60)
    await asyncio.wait_for(started.wait(), GUARD_S)
    # 60 of 100 bytes are held until that answer ends: 41 more do not fit, by length...
    reader, writer = await connect(server)
    writer.write(b"POST /a HTTP/1.1\r\nHost: gw\r\nContent-Length: 41\r\n\r\n" + b"a" * 41)
    status, headers, body = await read_response(reader)
    assert (status, headers[b"retry-after"]) == (503, b"1")
    assert "retry shortly" in json.loads(body)["error"]["message"]
    writer.close()
    # ...nor chunk by chunk, while 40 do.
    reader, writer = await connect(server)
    writer.write(
        b"POST /b HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"14\r\n" + b"b" * 20 + b"\r\n14\r\n" + b"b" * 20 + b"\r\n1\r\nb\r\n0\r\n\r\n"
    )
    assert (await read_response(reader))[0] == 503
    writer.close()
    reader, writer = await connect(server)
    writer.write(b"POST /c HTTP/1.1\r\nHost: gw\r\nContent-Length: 40\r\n\r\n" + b"c" * 40)
    assert (await read_response(reader))[0] == 200
    # Once the held answer ends, its bytes are free again.
    release.set()
    assert (await read_response(holder_reader))[0] == 200
    writer.write(b"POST /d HTTP/1.1\r\nHost: gw\r\nContent-Length: 60\r\n\r\n" + b"d" * 60)
    assert (await read_response(reader))[0] == 200
    assert seen == [b"h" * 60, b"c" * 40, b"d" * 60]  # the refused never reached the handler
    writer.close()
    holder.close()


async def test_a_stream_to_an_http_1_0_client_is_delimited_by_the_close(serve: Serve) -> None:
    async def handler(request: Request, writer: ResponseWriter) -> None:
        writer.start(200, [(b"content-type", b"text/event-stream")])
        writer.write(b"data: 1\n\n")
        writer.end(b"data: 2\n\n")

    server = await serve(handler)
    for keep_alive in (b"", b"Connection: keep-alive\r\n"):
        reader, writer = await connect(server)
        writer.write(b"GET /s HTTP/1.0\r\n%b\r\n" % keep_alive)
        data = await asyncio.wait_for(reader.read(), GUARD_S)  # all of it, to the close
        head, _, body = data.partition(b"\r\n\r\n")
        assert b"transfer-encoding" not in head.lower()
        assert b"connection: close" in head.lower()
        assert body == b"data: 1\n\ndata: 2\n\n"
        writer.close()


async def test_an_http_1_1_request_without_host_gets_a_400(serve: Serve) -> None:
    handled: list[Request] = []

    async def handler(request: Request, writer: ResponseWriter) -> None:
        handled.append(request)
        await echo(request, writer)

    server = await serve(handler)
    reader, writer = await connect(server)
    writer.write(b"GET / HTTP/1.1\r\n\r\n")
    status, _, body = await read_response(reader)
    assert status == 400
    assert "Host" in json.loads(body)["error"]["message"]
    assert await asyncio.wait_for(reader.read(), GUARD_S) == b""
    reader, writer = await connect(server)
    writer.write(b"GET / HTTP/1.0\r\n\r\n")  # HTTP/1.0 has no Host to require
    assert (await read_response(reader))[0] == 200
    assert len(handled) == 1


@pytest.mark.parametrize(
    ("length", "limits", "status"),
    [
        (11, ServerLimits(max_body_bytes=10), 413),
        (10, ServerLimits(max_body_bytes=10, max_buffered_body_bytes=10), 100),
        (50, ServerLimits(max_body_bytes=60, max_buffered_body_bytes=60), 503),
    ],
)
async def test_expect_100_continue_is_refused_before_the_body_when_it_cannot_be_taken(
    serve: Serve, length: int, limits: ServerLimits, status: int
) -> None:
    holding = asyncio.Event()
    release = asyncio.Event()

    async def handler(request: Request, writer: ResponseWriter) -> None:
        if request.path == b"/hold":
            holding.set()
            await release.wait()
        writer.send(200, [], b"")

    server = await serve(handler, limits)
    if status == 503:  # 20 bytes held by another request: 50 more do not fit
        _, holder = await connect(server)
        holder.write(b"POST /hold HTTP/1.1\r\nHost: gw\r\nContent-Length: 20\r\n\r\n" + b"h" * 20)
        await asyncio.wait_for(holding.wait(), GUARD_S)
    reader, writer = await connect(server)
    writer.write(
        b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\nexpect: 100-continue\r\n\r\n"
        % length
    )
    if status == 100:
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD_S)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"b" * length)
        assert (await read_response(reader))[0] == 200
    else:
        got, _, body = await read_response(reader)  # without sending the body
        assert got == status
        assert json.loads(body)["error"]["message"]
        assert await asyncio.wait_for(reader.read(), GUARD_S) == b""
    release.set()
