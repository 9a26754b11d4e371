"""The audit log: one JSON line per event, never a key, and a flood of bad keys costs at most
FAILURES_PER_S lines a second (the rest counted)."""

from __future__ import annotations

import json
from pathlib import Path

from fleetgate.lifecycle.events import Rejected
from fleetgate.observe.audit import FAILURES_PER_S, AuditLog


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.25

    def __call__(self) -> float:
        return self.now


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_flood_of_bad_keys_writes_a_bounded_number_of_lines(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, clock)
    for i in range(1000):  # one second's flood
        log.on_rejected(Rejected(b"r%d" % i, 0.0, 401, "invalid_api_key"))
    written = [e for e in lines(path) if e["event"] == "auth_failed"]
    assert len(written) == FAILURES_PER_S
    clock.now += 1.0
    log.on_rejected(Rejected(b"next", 0.0, 401, "invalid_api_key"))
    last = lines(path)[-1]
    assert last["request_id"] == "next"
    assert last["suppressed_before"] == 1000 - FAILURES_PER_S
    assert last["time"] == "2027-01-15T08:00:01.250Z"


def test_other_refusals_are_not_audited(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, Clock())
    log.on_rejected(Rejected(b"r", 0.0, 429, "rate_limit_exceeded", "t"))
    assert [e["event"] for e in lines(path)] == ["audit_log_opened"]
