"""The open-loop driver: send each request at its time, whatever the server is doing.

Each request is sent by its own task, started at the spec's time; the driver never waits for
a response before sending the next, so a slow server meets the same offered load as a fast
one. The next body is built before sleeping until its time, so building prompts does not
delay sends. Sending stops at the duration; requests still running after the grace period
are cancelled and recorded as errors of kind "timeout".

Error kinds: "connect", "read" (connection lost mid-response), "protocol", "http_<status>",
"stream_error" (an error object in the body or stream), "bad_json", "no_output" (a 200 with
no generated text), "timeout" (the answer did not end in time: the request timeout, or the
grace period), "no_answer" (not even the answer's head came within the request timeout: the
server left the client hanging), and "internal:<exception>" for a bug in this module.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from fleetgate.bench.payload import PATHS, encode_request, parse_chunk
from fleetgate.bench.stats import RequestRecord
from fleetgate.bench.workloads import RequestSpec
from fleetgate.http.client import HttpClient, Origin
from fleetgate.http.errors import ConnectError, ProtocolError, ReadError, UpstreamError
from fleetgate.http.sse import SseDecoder
from fleetgate.openai_api import DONE
from fleetgate.tokens import count_tokens

Clock = Callable[[], float]  # monotonic seconds
Sleep = Callable[[float], Awaitable[None]]


class RunObserver(Protocol):
    """Told of each send and each finished request (the progress bar is one)."""

    def request_sent(self, now_s: float) -> None: ...

    def request_done(self, record: RequestRecord, now_s: float) -> None: ...


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """How the requests are sent."""

    model: str
    duration_s: float  # no request is sent after this many seconds
    stream: bool = True
    grace_s: float = 30.0  # how long in-flight requests may finish after sending stops
    api_key: str | None = None  # sent as a bearer token when given
    request_timeout_s: float | None = None  # a client that gives up after this; None: never
    headers: tuple[tuple[bytes, bytes], ...] = ()  # more request headers (lower-case names)

    def __post_init__(self) -> None:
        if not self.duration_s > 0:
            raise ValueError(f"duration must be positive, not {self.duration_s}")
        if self.grace_s < 0:
            raise ValueError(f"grace period must not be negative, not {self.grace_s}")


@dataclass(frozen=True, slots=True)
class RunResult:
    records: list[RequestRecord]  # in the order they finished
    duration_s: float  # from the start to the last request's end (or the grace deadline)
    max_lag_s: float  # the latest any send left against its schedule: the load was honest if small


class _Attempt:
    """A request in flight, filled in as its response arrives."""

    __slots__ = (
        "answered", "first_s", "index", "itl", "last_s", "retry_after", "sent_at", "spec", "start",
    )  # fmt: skip

    def __init__(self, index: int, spec: RequestSpec, start: float, sent_at: float) -> None:
        self.index = index
        self.spec = spec
        self.start = start  # the run's start on the clock
        self.sent_at = sent_at  # on the clock
        self.first_s: float | None = None
        self.last_s = 0.0
        self.answered = False  # the answer's head came
        self.retry_after: float | None = None
        self.itl = array("d")

    def text_arrived(self, now: float) -> None:
        if self.first_s is None:
            self.first_s = now
        else:
            self.itl.append(now - self.last_s)
        self.last_s = now

    def record(self, now: float, output_tokens: int, error: str | None) -> RequestRecord:
        return RequestRecord(
            index=self.index,
            scheduled_s=self.spec.at_s,
            sent_s=self.sent_at - self.start,
            prompt_tokens=self.spec.prompt_tokens,
            output_tokens=output_tokens,
            error=error,
            ttft_s=None if self.first_s is None else self.first_s - self.sent_at,
            itl_s=self.itl,
            e2e_s=now - self.sent_at,
            retry_after_s=self.retry_after,
        )


class _Run:
    """The requests of one run: those in flight and the records of those that ended."""

    def __init__(self, start: float, clock: Clock, observer: RunObserver | None) -> None:
        self.start = start
        self.records: list[RequestRecord] = []
        self.max_lag_s = 0.0
        self._clock = clock
        self._observer = observer
        self._in_flight: dict[asyncio.Task[RequestRecord], _Attempt] = {}

    def started(self, attempt: _Attempt, task: asyncio.Task[RequestRecord]) -> None:
        now_s = attempt.sent_at - self.start
        self.max_lag_s = max(self.max_lag_s, now_s - attempt.spec.at_s)
        self._in_flight[task] = attempt
        task.add_done_callback(self._finished)
        if self._observer is not None:
            self._observer.request_sent(now_s)

    def _finished(self, task: asyncio.Task[RequestRecord]) -> None:
        attempt = self._in_flight.pop(task)
        if task.cancelled():
            return  # recorded by drain as a timeout
        exc = task.exception()
        if exc is None:
            self._add(task.result())
        else:
            self._add(attempt.record(self._clock(), 0, f"internal:{type(exc).__name__}"))

    def _add(self, record: RequestRecord) -> None:
        self.records.append(record)
        if self._observer is not None:
            self._observer.request_done(record, self._clock() - self.start)

    def abandon(self) -> None:
        """Cancel every request in flight, recording nothing (the run itself was cancelled)."""
        for task in list(self._in_flight):
            task.cancel()

    async def drain(self, grace_s: float) -> None:
        """Wait up to `grace_s` for the requests in flight; cancel the rest as timeouts."""
        if not self._in_flight:
            return
        _, pending = await asyncio.wait(list(self._in_flight), timeout=grace_s)
        if not pending:
            return
        late = [self._in_flight[task] for task in pending]
        for task in pending:
            task.cancel()
        await asyncio.wait(pending)
        now = self._clock()
        for attempt in late:
            self._add(attempt.record(now, 0, "timeout"))


class LoadGenerator:
    """Sends a workload to one origin, open-loop, and records every request."""

    def __init__(
        self,
        client: HttpClient,
        origin: Origin,
        settings: LoadSettings,
        *,
        clock: Clock,
        sleep: Sleep = asyncio.sleep,
        observer: RunObserver | None = None,
    ) -> None:
        self._client = client
        self._origin = origin
        self._settings = settings
        self._clock = clock
        self._sleep = sleep
        self._observer = observer
        headers = [(b"content-type", b"application/json")]
        if settings.stream:
            headers.append((b"accept", b"text/event-stream"))
        if settings.api_key:
            headers.append((b"authorization", b"Bearer " + settings.api_key.encode()))
        headers += settings.headers
        self._headers = headers

    async def run(
        self, specs: Iterable[RequestSpec], stop: asyncio.Event | None = None
    ) -> RunResult:
        """Send `specs` (times ascending) and return once every request has ended.

        Setting `stop` (Ctrl-C, say) ends sending early; in-flight requests still get the
        grace period, so an interrupted run keeps what it measured.
        """
        run = _Run(self._clock(), self._clock, self._observer)
        sending = asyncio.create_task(self._send_all(specs, run))
        try:
            if stop is not None:
                stopped = asyncio.create_task(stop.wait())
                await asyncio.wait((sending, stopped), return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                sending.cancel()  # nothing when it is done already
            await asyncio.wait((sending,))  # unlike `await sending`, lets our own cancel through
            if not sending.cancelled():
                sending.result()  # raise what broke the sender, if anything did
            await run.drain(self._settings.grace_s)
        except asyncio.CancelledError:
            sending.cancel()
            run.abandon()
            raise
        return RunResult(run.records, self._clock() - run.start, run.max_lag_s)

    async def _send_all(self, specs: Iterable[RequestSpec], run: _Run) -> None:
        clock, settings = self._clock, self._settings
        for index, spec in enumerate(specs):
            body = encode_request(spec, model=settings.model, stream=settings.stream)
            delay = run.start + spec.at_s - clock()
            if delay > 0:
                await self._sleep(delay)
            now = clock()
            if now - run.start >= settings.duration_s:
                return
            attempt = _Attempt(index, spec, run.start, now)
            run.started(attempt, asyncio.create_task(self._send(attempt, body)))

    async def _send(self, attempt: _Attempt, body: bytes) -> RequestRecord:
        timeout_s = self._settings.request_timeout_s
        if timeout_s is None:
            return await self._exchange(attempt, body)
        try:
            async with asyncio.timeout(timeout_s):
                return await self._exchange(attempt, body)
        except TimeoutError:
            kind = "timeout" if attempt.answered else "no_answer"
            return attempt.record(self._clock(), 0, kind)

    async def _exchange(self, attempt: _Attempt, body: bytes) -> RequestRecord:
        path = PATHS[attempt.spec.endpoint]
        try:
            response = await self._client.request(self._origin, b"POST", path, self._headers, body)
            attempt.answered = True
            try:
                if response.status != 200:
                    wait = response.header(b"retry-after")
                    if wait is not None:
                        try:
                            attempt.retry_after = float(wait)
                        except ValueError:
                            attempt.retry_after = -1.0  # present, but not a number of seconds
                    await response.read()  # drain it, so the connection can be reused
                    return attempt.record(self._clock(), 0, f"http_{response.status}")
                if self._settings.stream:
                    return await self._read_stream(attempt, response.chunks())
                return self._read_whole(attempt, await response.read())
            finally:
                response.close()  # aborts the connection only if the body is unfinished
        except ConnectError:
            kind = "connect"
        except ReadError:
            kind = "read"
        except ProtocolError:
            kind = "protocol"
        except UpstreamError:
            kind = "upstream"
        except msgspec.DecodeError:
            kind = "bad_json"
        return attempt.record(self._clock(), 0, kind)

    async def _read_stream(self, attempt: _Attempt, chunks: AsyncIterable[bytes]) -> RequestRecord:
        clock = self._clock
        decoder = SseDecoder()
        texts: list[str] = []
        usage_tokens: int | None = None
        async for chunk in chunks:
            now = clock()  # first, so decoding time is not charged to the server
            got_text = False
            for data in decoder.feed(chunk):
                if data == DONE:
                    continue
                content = parse_chunk(data)
                if content.error is not None:
                    return attempt.record(clock(), 0, "stream_error")
                if content.text:
                    texts.append(content.text)
                    got_text = True
                if content.completion_tokens is not None:
                    usage_tokens = content.completion_tokens
            if got_text:
                attempt.text_arrived(now)
        return self._finish(attempt, clock(), texts, usage_tokens)

    def _read_whole(self, attempt: _Attempt, body: bytes) -> RequestRecord:
        now = self._clock()
        content = parse_chunk(body)
        if content.error is not None:
            return attempt.record(now, 0, "stream_error")
        return self._finish(attempt, now, [content.text], content.completion_tokens)

    @staticmethod
    def _finish(
        attempt: _Attempt, now: float, texts: list[str], usage_tokens: int | None
    ) -> RequestRecord:
        # The server's count when it gave one; otherwise the text's, by the project's rule.
        tokens = usage_tokens if usage_tokens is not None else count_tokens("".join(texts))
        if tokens == 0 and not any(texts):
            return attempt.record(now, 0, "no_output")
        return attempt.record(now, tokens, None)
