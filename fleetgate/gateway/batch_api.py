"""The Batch API's endpoints (OpenAI's shapes), over batches/:

    POST /v1/files                  upload (multipart: `file`, `purpose=batch`)
    GET  /v1/files                  list (`limit`, `after`, `order`, `purpose`)
    GET  /v1/files/{id}             one file's object
    GET  /v1/files/{id}/content     its content
    DELETE /v1/files/{id}
    POST /v1/batches                create {input_file_id, endpoint, completion_window, metadata}
    GET  /v1/batches                list (`limit`, `after`), newest first
    GET  /v1/batches/{id}
    POST /v1/batches/{id}/cancel

Files and batches are their tenant's (the anonymous tenant's with auth off): another tenant's
are answered 404, as if they did not exist.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import parse_qs

import msgspec

from fleetgate.batches.book import BatchBook
from fleetgate.batches.files import FileShelf
from fleetgate.batches.ids import valid_id
from fleetgate.gateway.requests import is_form, multipart_field, multipart_file
from fleetgate.http.server import Request
from fleetgate.http.writer import ResponseWriter
from fleetgate.openai_api import JSON, error_body
from fleetgate.traffic.door import ANONYMOUS_CALLER, Caller, FrontDoor, Refused
from fleetgate.traffic.tenants import Tenant

log = logging.getLogger(__name__)
_Handler = Callable[[Request, ResponseWriter, bytes], Awaitable[None]]
# Serves a request for one file or batch, by its id: answered whole, or streamed.
_ItemHandler = Callable[[Request, ResponseWriter, bytes, str], Awaitable[None]]
# An endpoint's work: (content type, body) of its 200 answer, or `Refused`.
_Action = Callable[[Request, Caller, str], Awaitable[tuple[bytes, bytes]]]
_FILES, _BATCHES = b"/v1/files/", b"/v1/batches/"
_OCTETS = b"application/octet-stream"
_CHUNK = 256 * 1024  # bytes of a file's content read (in a thread) and sent at a time


class _CreateBatch(msgspec.Struct):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


_create = msgspec.json.Decoder(_CreateBatch)
_encode = msgspec.json.Encoder().encode


class BatchApi:
    def __init__(self, shelf: FileShelf, book: BatchBook, door: FrontDoor | None) -> None:
        self._shelf = shelf
        self.book = book
        self._door = door  # None: auth off, every file and batch the anonymous tenant's
        # The paths under /v1/files/{id} and /v1/batches/{id} (None: that path itself), and
        # each one's handler by method: a method not in its table is answered 405.
        self._items: dict[tuple[bytes, bytes | None], dict[bytes, _ItemHandler]] = {
            (_FILES, None): {
                b"GET": self._answering(self._file),
                b"DELETE": self._answering(self._delete_file),
            },
            (_FILES, b"content"): {b"GET": self._send_content},
            (_BATCHES, None): {b"GET": self._answering(self._batch)},
            (_BATCHES, b"cancel"): {b"POST": self._answering(self._cancel)},
        }

    def use(self, door: FrontDoor | None, tenants: Mapping[str, Tenant]) -> None:
        """A reloaded config's door and tenants, from the next request on."""
        self._door = door
        self.book.configure(tenants, None if door is None else door.callers())

    def routes(self) -> dict[tuple[bytes, bytes], _Handler]:
        """The handlers of its fixed paths; `item` serves those under them."""
        return {
            (b"POST", b"/v1/files"): self._handler(self._upload),
            (b"GET", b"/v1/files"): self._handler(self._files),
            (b"POST", b"/v1/batches"): self._handler(self._create_batch),
            (b"GET", b"/v1/batches"): self._handler(self._batches),
        }

    @staticmethod
    def serves(path: bytes) -> bool:
        return path.startswith((_FILES, _BATCHES))

    async def item(self, request: Request, writer: ResponseWriter, request_id: bytes) -> None:
        """/v1/files/{id}[/content] and /v1/batches/{id}[/cancel]."""
        prefix = _FILES if request.path.startswith(_FILES) else _BATCHES
        rest = request.path[len(prefix) :].split(b"/")
        item = rest[0].decode("latin-1")
        what = "file" if prefix == _FILES else "batch"
        if not valid_id(item) or len(rest) > 2:  # never a path built from it: store.py
            _send_error(writer, request_id, Refused(404, f"No such {what}.", "not_found"))
            return
        handlers = self._items.get((prefix, rest[1] if len(rest) == 2 else None))
        if handlers is None:
            _send_error(writer, request_id, Refused(404, f"No such {what} path.", "not_found"))
            return
        handler = handlers.get(request.method)
        if handler is None:
            allowed = ", ".join(m.decode() for m in handlers)
            message = f"{request.method.decode('latin-1')} is not allowed here; use {allowed}."
            refused = Refused(405, message, "method_not_allowed", [(b"allow", allowed.encode())])
            _send_error(writer, request_id, refused)
            return
        await handler(request, writer, request_id, item)

    def _handler(self, action: _Action) -> _Handler:
        """A fixed path's handler: its action, answered whole."""

        async def handle(request: Request, writer: ResponseWriter, request_id: bytes) -> None:
            await self._answer(request, writer, request_id, action, "")

        return handle

    def _answering(self, action: _Action) -> _ItemHandler:
        """An item's handler: its action, answered whole."""

        async def handle(
            request: Request, writer: ResponseWriter, request_id: bytes, item: str
        ) -> None:
            await self._answer(request, writer, request_id, action, item)

        return handle

    def _caller(self, request: Request) -> Caller:
        return ANONYMOUS_CALLER if self._door is None else self._door.identify(request.headers)

    async def _answer(
        self, request: Request, writer: ResponseWriter, request_id: bytes, action: _Action,
        item: str,
    ) -> None:  # fmt: skip
        try:
            await self.book.refresh()  # shared: what the other gateways wrote
            try:
                content_type, body = await action(request, self._caller(request), item)
            finally:
                await self.book.tell()  # shared: what this one wrote, before it answers
        except Refused as exc:
            _send_error(writer, request_id, exc)
            return
        except OSError as exc:  # the store's disk (full, or gone): no fault of the client's
            log.error("batches: the store failed: %s", exc)
            message = "The gateway cannot use its batch storage right now; retry later."
            _send_error(writer, request_id, Refused(503, message, "storage_unavailable"))
            return
        writer.send(200, [(b"content-type", content_type), (b"x-request-id", request_id)], body)

    # Files.

    async def _upload(self, request: Request, caller: Caller, item: str) -> tuple[bytes, bytes]:
        if request.body_too_large:
            raise Refused(
                413, "The file is larger than this gateway accepts (`server.max_body_bytes`); "
                "split it into several batches.", "request_too_large",
            )  # fmt: skip
        content_type = request.headers.get(b"content-type", b"")
        sent = (
            multipart_file(request.body, content_type, b"file")
            if is_form(request.headers)
            else None
        )
        if sent is None:
            raise Refused(400, "Send the file as multipart/form-data field `file`, with "
                          "`purpose=batch`.", "invalid_value", param="file")  # fmt: skip
        purpose = multipart_field(request.body, content_type, b"purpose") or b""
        filename, data = sent
        file = await self._shelf.upload(
            caller.tenant.name, filename, purpose.decode("utf-8", "replace"), data
        )
        return JSON, _encode(file)

    async def _files(self, request: Request, caller: Caller, item: str) -> tuple[bytes, bytes]:
        query = _query(request)
        limit = _limit(query, 10_000, 10_000)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise Refused(400, "`order` must be asc or desc.", "invalid_value", param="order")
        files, more = self._shelf.listing(
            caller.tenant.name, query.get("purpose"), limit, query.get("after"), order == "desc"
        )
        return JSON, _listing(files, [f.id for f in files], more)

    async def _file(self, request: Request, caller: Caller, item: str) -> tuple[bytes, bytes]:
        return JSON, _encode(self._shelf.get(caller.tenant.name, item))

    async def _send_content(
        self, request: Request, writer: ResponseWriter, request_id: bytes, item: str
    ) -> None:
        """A file's content, read in a thread and sent a chunk at a time: a large output file
        neither blocks the loop nor sits whole in memory."""
        try:
            await self.book.refresh()
            path = self._shelf.content_path(self._caller(request).tenant.name, item)
            source = await asyncio.to_thread(path.open, "rb")
        except Refused as exc:
            _send_error(writer, request_id, exc)
            return
        except OSError:
            refused = Refused(404, f"The file {item!r} has no content any more.", "not_found")
            _send_error(writer, request_id, refused)
            return
        try:
            writer.start(200, [(b"content-type", _OCTETS), (b"x-request-id", request_id)])
            while chunk := await asyncio.to_thread(source.read, _CHUNK):
                if not writer.write(chunk):
                    await writer.drain()
            writer.end()
        finally:
            source.close()

    async def _delete_file(
        self, request: Request, caller: Caller, item: str
    ) -> tuple[bytes, bytes]:
        self._shelf.delete(caller.tenant.name, item)
        return JSON, _encode({"id": item, "object": "file", "deleted": True})

    # Batches.

    async def _create_batch(
        self, request: Request, caller: Caller, item: str
    ) -> tuple[bytes, bytes]:
        try:
            sent = _create.decode(request.body)
        except msgspec.DecodeError as exc:
            raise Refused(
                400, f"The body is not what POST /v1/batches takes ({exc}): send a JSON object "
                "with `input_file_id`, `endpoint` and `completion_window`.", "invalid_value",
            ) from None  # fmt: skip
        batch = await self.book.create(
            caller, sent.input_file_id, sent.endpoint, sent.completion_window, sent.metadata
        )
        return JSON, _encode(batch)

    async def _batches(self, request: Request, caller: Caller, item: str) -> tuple[bytes, bytes]:
        query = _query(request)
        limit = _limit(query, 20, 100)
        batches, more = self.book.listing(caller.tenant.name, limit, query.get("after"))
        return JSON, _listing(batches, [b.id for b in batches], more)

    async def _batch(self, request: Request, caller: Caller, item: str) -> tuple[bytes, bytes]:
        return JSON, _encode(self.book.get(caller.tenant.name, item))

    async def _cancel(self, request: Request, caller: Caller, item: str) -> tuple[bytes, bytes]:
        return JSON, _encode(self.book.cancel(caller.tenant.name, item))


def _send_error(writer: ResponseWriter, request_id: bytes, exc: Refused) -> None:
    headers = [(b"content-type", JSON), (b"x-request-id", request_id), *exc.headers]
    writer.send(exc.status, headers, error_body(exc.status, exc.message, exc.param, exc.code))


def _query(request: Request) -> dict[str, str]:
    """The query's parameters, the last value of each."""
    try:
        parsed = parse_qs(request.query.decode("latin-1"), max_num_fields=20)
    except ValueError:
        raise Refused(400, "The query has too many parameters.", "invalid_value") from None
    return {k: v[-1] for k, v in parsed.items()}


def _limit(query: dict[str, str], default: int, most: int) -> int:
    text = query.get("limit")
    if text is None:
        return default
    if not (text.isascii() and text.isdigit() and len(text) < 7 and 1 <= int(text) <= most):
        raise Refused(400, f"`limit` must be a number from 1 to {most}.", "invalid_value",
                      param="limit")  # fmt: skip
    return int(text)


def _listing(data: object, ids: list[str], more: bool) -> bytes:
    return _encode(
        {"object": "list", "data": data, "first_id": ids[0] if ids else None,
         "last_id": ids[-1] if ids else None, "has_more": more}
    )  # fmt: skip
