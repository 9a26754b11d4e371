"""The request log: one line per request once it is over, from the lifecycle's events.

On standard output (`request_log.path: "-"`, the default) or appended to a file; JSON lines
when the output is not a terminal, a readable line when it is (`format: auto`):

    {"time":"2026-11-26T02:10:00.123Z","request_id":"6a1f0c2e-41","tenant":"gold",
     "priority":"critical","model":"llama-3.1-8b-instruct","backend":"h100-0","attempts":1,
     "status":200,"outcome":"answered","queued_ms":0.1,"ttft_ms":120.5,"e2e_ms":2301.0,
     "prompt_tokens":1024,"completion_tokens":128,"cost_usd":0.000138}
    02:10:00.123 200 answered gold/critical llama-3.1-8b-instruct -> h100-0 ttft 120 ms
        e2e 2.30 s 1024+128 tok $0.000138 [6a1f0c2e-41]

A field the gateway does not know is left out: a refused request has no backend, and its
`reason` (the error's code) instead; tokens and cost come with answers whose use is counted
(a tenant with a tokens limit, a budget, or a pool with prices). Never written: prompts,
answers, keys (the tenant names the caller), header values. `model` is the pool's, never the
string a client sent (a request refused before routing has none).

At high rates lines are sampled: `sample` of the answered requests under 500 (every failure
is kept), and at most `max_lines_per_s` lines a second; what is left out is counted in the
next line written (`skipped_before`). Nothing is kept of a request while it runs (its
Finished says whose it was, its class, its queue time and attempts). Lines are written in
batches, `flush_s` apart, with one write each: the request path only appends to a list.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable
from typing import Literal

import msgspec

from fleetgate.lifecycle.events import (
    NO_BACKEND,
    Finished,
    Rejected,
)
from fleetgate.lifecycle.hooks import Hooks
from fleetgate.settings import Settings, at_least, positive_seconds, within

Schedule = Callable[[float, Callable[[], None]], object]


class RequestLogSettings(Settings, frozen=True):
    """The `request_log:` section."""

    enabled: bool = True
    path: str = "-"  # "-": standard output; else a file, appended to
    format: Literal["auto", "json", "text"] = "auto"  # auto: text on a terminal, else JSON
    sample: float = 1.0  # share of answered requests (status < 500) written
    max_lines_per_s: int = 1000  # lines written a second at most; the rest are counted
    flush_s: float = 0.2  # lines wait this long at most before they are written

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError('`path` must be "-" (standard output) or a file')
        within("sample", self.sample, 0, 1)
        at_least("max_lines_per_s", self.max_lines_per_s, 1)
        positive_seconds("flush_s", self.flush_s)


class Line(msgspec.Struct, omit_defaults=True):
    """One request, as the log writes it (fields left at None are left out)."""

    time: str
    request_id: str
    tenant: str
    status: int
    outcome: str
    priority: str | None = None
    model: str | None = None
    backend: str | None = None
    reason: str | None = None
    attempts: int = 0
    queued_ms: float | None = None  # from its arrival until admitted to its pool
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    cache: str | None = None  # hit, coalesced or miss, for a request the cache keeps
    trace_id: str | None = None  # with tracing on, for a sampled request
    skipped_before: int | None = None


_encode_lines = msgspec.json.Encoder().encode_lines  # JSON lines, in one call
_MILLIS = tuple(f".{ms:03d}Z" for ms in range(1000))  # a time stamp's end, by millisecond


def _ms(seconds: float) -> float:
    """`seconds` >= 0 in milliseconds, to a tenth (round(x, 1) goes through a string: 4x the
    time, and three of them were a tenth of the log's cost a line)."""
    return int(seconds * 10_000 + 0.5) / 10


class RequestLog:
    def __init__(
        self,
        settings: RequestLogSettings,
        write: Callable[[bytes], None],
        text: bool,
        schedule: Schedule,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self._settings = settings
        self._write = write
        self._text = text
        self._schedule = schedule  # the lifecycle clock's call_later: the next flush
        self._wall = wall_clock
        self._rng = rng or random.Random()
        # A refused request's tenant, class and reason, until its Finished (in the same step).
        self._refused: dict[bytes, tuple[str, str, str]] = {}
        self._pending: list[Line] = []
        self._armed = False
        self._second = -1  # the wall clock's whole second lines are counted in
        self._lines = 0  # lines taken in it
        self._skipped = 0  # left out since the last line taken
        self._stamped = -1  # the wall clock's second `_stamp_head` is of
        self._stamp_head = ""
        # With tracing on: a request's trace id while it is open (None: not sampled).
        self.trace_ids: Callable[[bytes], str | None] | None = None

    def subscribe(self, hooks: Hooks) -> None:
        """Hear a request's end (the edge's Finished and each pool's, with what it used) and a
        refusal's reason: a routed request's Finished says all the rest, so nothing is kept
        of a request while it runs."""
        hooks.subscribe(Rejected, self.on_rejected)
        hooks.subscribe(Finished, self.on_finished)

    def on_rejected(self, event: Rejected) -> None:
        self._refused[event.request_id] = (event.tenant, event.priority, event.reason)

    def on_finished(self, event: Finished) -> None:
        refused = self._refused.pop(event.request_id, None) if self._refused else None
        now = self._wall()
        if not self._taken(event.status, now):
            return
        tenant, priority, reason = event.tenant, event.priority, None
        if refused is not None:
            tenant, priority, reason = refused
        queued = event.queued_s
        ttft = event.ttft_s
        prompt, cost = event.prompt_tokens, event.cost_usd
        line = Line(
            time=self._stamp(now),
            request_id=event.request_id.decode("latin-1"),
            tenant=tenant,
            status=event.status,
            outcome=event.outcome,
            priority=priority or None,
            model=event.model or None,
            backend=None if event.backend == NO_BACKEND else event.backend,
            reason=reason,
            attempts=event.attempts,
            queued_ms=None if queued is None else _ms(queued),
            ttft_ms=None if ttft is None else _ms(ttft),
            e2e_ms=_ms(event.at - event.started),
            prompt_tokens=prompt,
            completion_tokens=None if prompt is None else event.completion_tokens,
            cost_usd=None if prompt is None else round(cost, 9) if cost else 0.0,
            cache=event.cache or None,
        )
        if self.trace_ids is not None:
            line.trace_id = self.trace_ids(event.request_id)
        if self._skipped:
            line.skipped_before, self._skipped = self._skipped, 0
        self._pending.append(line)
        if not self._armed:
            self._armed = True
            self._schedule(self._settings.flush_s, self.flush)

    def _stamp(self, now: float) -> str:
        """`now` in ISO 8601 (UTC, milliseconds); the second's part made once a second."""
        second = int(now)
        if second != self._stamped:
            self._stamped = second
            self._stamp_head = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return self._stamp_head + _MILLIS[int(now % 1 * 1000)]

    def _taken(self, status: int, now: float) -> bool:
        """Whether a request's line is written: sampling, then the rate cap."""
        settings = self._settings
        if status < 500 and settings.sample < 1 and self._rng.random() >= settings.sample:
            self._skipped += 1
            return False
        second = int(now)
        if second != self._second:
            self._second, self._lines = second, 0
        if self._lines >= settings.max_lines_per_s:
            self._skipped += 1
            return False
        self._lines += 1
        return True

    def flush(self) -> None:
        """Write the lines waiting, with one write."""
        self._armed = False
        lines, self._pending = self._pending, []
        if lines:
            text = self._text
            self._write(b"".join(_text(line) for line in lines) if text else _encode_lines(lines))

    @property
    def open_requests(self) -> int:
        """Refusals whose Finished has not come yet: all the log keeps of requests in
        progress (for tests: nothing is kept after a request)."""
        return len(self._refused)


def open_request_log(
    settings: RequestLogSettings, schedule: Schedule, wall_clock: Callable[[], float] = time.time
) -> RequestLog:
    """The request log `settings` ask for, writing to standard output or its file, its
    flushes scheduled by `schedule` (the lifecycle clock's call_later)."""
    if settings.path == "-":
        stream = sys.stdout

        def write(data: bytes) -> None:
            stream.buffer.write(data)
            stream.buffer.flush()

        terminal = stream.isatty()
    else:
        path = settings.path

        def write(data: bytes) -> None:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

        write(b"")  # fails at start, not at the first request, if it cannot be written
        terminal = False
    text = settings.format == "text" or (settings.format == "auto" and terminal)
    return RequestLog(settings, write, text, schedule, wall_clock)


def _text(line: Line) -> bytes:
    parts = [line.time[11:23], str(line.status), line.outcome]
    who = line.tenant or "-"
    parts.append(f"{who}/{line.priority}" if line.priority else who)
    if line.model:
        parts.append(line.model)
    if line.backend:
        parts.append(f"-> {line.backend}")
    if line.reason:
        parts.append(line.reason)
    if line.attempts > 1:
        parts.append(f"{line.attempts} attempts")
    if line.queued_ms:
        parts.append(f"queued {line.queued_ms:.0f} ms")
    if line.ttft_ms is not None:
        parts.append(f"ttft {line.ttft_ms:.0f} ms")
    if line.e2e_ms is not None:
        parts.append(f"e2e {line.e2e_ms / 1000:.2f} s")
    if line.prompt_tokens is not None:
        parts.append(f"{line.prompt_tokens}+{line.completion_tokens} tok")
    if line.cost_usd:
        parts.append(f"${line.cost_usd:.6f}")
    if line.skipped_before:
        parts.append(f"({line.skipped_before} skipped before)")
    if line.cache:
        parts.append(f"cache {line.cache}")
    parts.append(f"[{line.request_id}]")
    if line.trace_id:
        parts.append(f"trace {line.trace_id}")
    return " ".join(parts).encode() + b"\n"
