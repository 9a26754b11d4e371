"""The request log, fed the lifecycle's events as the request path emits them."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from fleetgate.clock import LoopClock
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.lifecycle.events import (
    NO_BACKEND,
    Finished,
    Rejected,
)
from fleetgate.lifecycle.hooks import Emitters, Hooks
from fleetgate.observe.request_log import RequestLog, RequestLogSettings, open_request_log

MODEL = "llama-3.1-8b-instruct"
WALL = 1_764_122_400.25  # 2025-11-26T02:00:00.250Z
STATE = BackendState(Backend("10.0.0.5:8000", "http://10.0.0.5:8000", (MODEL,), name="h100-0"))


class Log:
    """A request log on a fake clock, its writes and flushes kept."""

    def __init__(self, text: bool = False, **settings: Any) -> None:
        self.wall = WALL
        self.written: list[bytes] = []
        self.scheduled: list[tuple[float, Callable[[], None]]] = []
        self.log = RequestLog(
            RequestLogSettings(**settings), self.written.append, text,
            lambda delay, callback: self.scheduled.append((delay, callback)), lambda: self.wall,
            random.Random(0),
        )  # fmt: skip
        hooks = Hooks()
        self.log.subscribe(hooks)
        self.emit = Emitters(hooks)

    def answered(self, rid: bytes, tenant: str = "gold", status: int = 200, tokens: bool = True,
                 attempts: int = 1) -> None:  # fmt: skip
        e = self.emit
        assert e.finished
        used = (1024, 128, 0.000138) if tokens else (None, 0, 0.0)
        e.finished(Finished(rid, 12.4, MODEL, 10.0, status, "h100-0", "answered", 0.1205, 128,
                            tenant, "critical", 0.05, attempts, *used))  # fmt: skip

    def refused(self, rid: bytes, status: int = 429, reason: str = "rate_limit_exceeded") -> None:
        e = self.emit
        assert e.rejected and e.finished
        e.rejected(Rejected(rid, 10.0, status, reason, "bronze", "sheddable"))
        e.finished(Finished(rid, 10.001, "", 10.0, status, NO_BACKEND, "rejected", None, None))

    def flush(self) -> None:
        for _, callback in self.scheduled:
            callback()
        self.scheduled.clear()

    def lines(self) -> list[dict[str, Any]]:
        self.flush()
        return [json.loads(line) for chunk in self.written for line in chunk.splitlines()]


def test_an_answered_request_is_one_json_line_with_its_tenant_backend_times_and_tokens() -> None:
    log = Log()
    log.answered(b"req-1", attempts=2)
    assert log.written == []  # written in a batch, not on the request path
    assert [delay for delay, _ in log.scheduled] == [0.2]
    assert log.lines() == [{
        "time": "2025-11-26T02:00:00.250Z", "request_id": "req-1", "tenant": "gold",
        "status": 200, "outcome": "answered", "priority": "critical", "model": MODEL,
        "backend": "h100-0", "attempts": 2, "queued_ms": 50.0, "ttft_ms": 120.5, "e2e_ms": 2400.0,
        "prompt_tokens": 1024, "completion_tokens": 128, "cost_usd": 0.000138,
    }]  # fmt: skip
    assert log.log.open_requests == 0  # nothing kept once a request is over


def test_a_refused_request_names_its_reason_and_no_backend() -> None:
    log = Log()
    log.refused(b"req-2")
    (line,) = log.lines()
    assert line == {
        "time": "2025-11-26T02:00:00.250Z", "request_id": "req-2", "tenant": "bronze",
        "status": 429, "outcome": "rejected", "priority": "sheddable",
        "reason": "rate_limit_exceeded", "e2e_ms": 1.0,
    }  # fmt: skip


def test_lines_are_written_in_one_batch_per_flush_and_tokens_go_with_their_own_request() -> None:
    log = Log()
    log.answered(b"a")
    log.answered(b"b", tokens=False)  # its use is not counted
    log.answered(b"c")
    assert len(log.scheduled) == 1  # one flush armed for the three
    lines = log.lines()
    assert len(log.written) == 1
    assert [(x["request_id"], x.get("prompt_tokens")) for x in lines] == [
        ("a", 1024), ("b", None), ("c", 1024)
    ]  # fmt: skip


def test_past_its_rate_lines_are_counted_in_the_next_one_written() -> None:
    log = Log(max_lines_per_s=2)
    for i in range(5):
        log.answered(f"r{i}".encode())
    log.wall += 1.0  # the next second
    log.answered(b"r5")
    lines = log.lines()
    assert [x["request_id"] for x in lines] == ["r0", "r1", "r5"]
    assert lines[-1]["skipped_before"] == 3
    assert log.log.open_requests == 0


def test_nothing_is_kept_of_a_request_while_it_runs() -> None:
    log = Log()
    hooks = Hooks()
    log.log.subscribe(hooks)
    assert Emitters(hooks).admitted is None and Emitters(hooks).attempt_started is None
    log.refused(b"r1")
    assert log.log.open_requests == 0  # a refusal's reason is kept only until its Finished


def test_sampling_keeps_every_failure() -> None:
    log = Log(sample=0.25)
    for i in range(400):
        log.answered(f"ok{i}".encode())
    for i in range(20):
        log.answered(f"bad{i}".encode(), status=502)
    lines = log.lines()
    kept = sum(1 for x in lines if x["request_id"].startswith("ok"))
    assert 60 <= kept <= 140  # about a quarter of 400
    assert sum(1 for x in lines if x["request_id"].startswith("bad")) == 20


def test_a_terminal_gets_a_readable_line() -> None:
    log = Log(text=True)
    log.answered(b"req-1")
    log.refused(b"req-2", 401, "invalid_api_key")
    log.flush()
    assert b"".join(log.written).decode().splitlines() == [
        "02:00:00.250 200 answered gold/critical llama-3.1-8b-instruct -> h100-0 queued 50 ms "
        "ttft 120 ms "
        "e2e 2.40 s 1024+128 tok $0.000138 [req-1]",
        "02:00:00.250 401 rejected bronze/sheddable invalid_api_key e2e 0.00 s [req-2]",
    ]


def test_a_request_id_is_written_as_json_text_whatever_its_bytes() -> None:
    log = Log()
    log.answered(b'odd"\\\n\x01id')
    (line,) = log.lines()
    assert line["request_id"] == 'odd"\\\n\x01id'


def test_a_file_is_appended_to_and_an_unwritable_one_fails_at_start(tmp_path: Any) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text('{"earlier": true}\n')
    log = open_request_log(RequestLogSettings(path=str(path)), LoopClock().call_later, lambda: WALL)
    log.flush()
    assert path.read_text() == '{"earlier": true}\n'
    with pytest.raises(FileNotFoundError):
        open_request_log(
            RequestLogSettings(path=str(tmp_path / "missing" / "dir" / "x")), LoopClock().call_later
        )


@pytest.mark.parametrize(
    "settings",
    [{"sample": 1.5}, {"sample": -0.1}, {"max_lines_per_s": 0}, {"flush_s": 0}, {"path": ""},
     {"format": "xml"}],
)  # fmt: skip
def test_bad_settings_are_refused(settings: dict[str, Any]) -> None:
    import msgspec

    with pytest.raises((ValueError, msgspec.ValidationError)):
        msgspec.convert(settings, RequestLogSettings)
