"""The batch lane's cap: it grows while batch requests wait at it, and comes down when the
interactive requests' time to first token rises over its recent best."""

from __future__ import annotations

import pytest

from fleetgate.lifecycle.events import FirstToken
from fleetgate.traffic.batch_lane import BatchLane, BatchLaneSettings


def first_tokens(lane: BatchLane, now: float, ttft_s: float, n: int = 9, batch: bool = False,
                 kind: str = "first") -> None:  # fmt: skip
    for _ in range(n):
        lane.on_first_token(
            FirstToken(b"r", now, "m", "b", kind, 100, None, now - ttft_s, batch)  # type: ignore[arg-type]
        )


def test_the_cap_grows_while_batch_waits_at_it_and_stays_under_its_share() -> None:
    lane = BatchLane(BatchLaneSettings(), backends=2, start=0.0)
    assert lane.cap == 2  # one per backend to start
    caps = []
    for second in range(1, 40):
        first_tokens(lane, second, 0.05)  # interactive TTFT steady
        lane.held()
        lane.tick(second, in_flight=int(lane.cap), ceiling=30.0)
        caps.append(lane.cap)
    assert caps[:3] == pytest.approx([3.2, 4.52, 5.972])  # x1.1 + 1 a second
    assert max(caps) == 30.0  # never over the share of the limit


def test_the_cap_does_not_grow_when_no_batch_request_waited() -> None:
    lane = BatchLane(BatchLaneSettings(), backends=1, start=0.0)
    lane.tick(1.0, in_flight=0, ceiling=30.0)
    assert lane.cap == 1


def test_interactive_first_tokens_slower_than_their_best_bring_the_cap_down() -> None:
    lane = BatchLane(BatchLaneSettings(), backends=1, start=0.0)
    for second in range(1, 30):  # batch grows with interactive TTFT at 50 ms
        first_tokens(lane, second, 0.05)
        lane.held()
        lane.tick(second, in_flight=int(lane.cap), ceiling=100.0)
    grown = lane.cap
    first_tokens(lane, 30.0, 0.08)  # 1.6x its best, over the 1.5x slack
    lane.tick(30.0, in_flight=int(lane.cap), ceiling=100.0)
    assert lane.cap == grown * 0.7
    first_tokens(lane, 31.0, 0.07)  # 1.4x: within the slack, and no batch waited
    lane.tick(31.0, in_flight=int(lane.cap), ceiling=100.0)
    assert lane.cap == grown * 0.7
    for second in range(32, 60):  # stays slow: down to one per backend, never below
        first_tokens(lane, second, 0.2)
        lane.tick(second, in_flight=int(lane.cap), ceiling=100.0)
    assert lane.cap == 1


def test_only_interactive_first_tokens_count_and_the_best_is_recent() -> None:
    lane = BatchLane(BatchLaneSettings(window_s=10.0), backends=1, start=0.0)
    first_tokens(lane, 1.0, 0.01)
    lane.tick(1.0, in_flight=1, ceiling=100.0)
    for second in range(2, 30):  # batch's own slow first tokens, and hedges', say nothing
        first_tokens(lane, second, 5.0, batch=True)
        first_tokens(lane, second, 5.0, kind="hedge")
        first_tokens(lane, second, 0.05)
        lane.held()
        lane.tick(second, in_flight=int(lane.cap), ceiling=100.0)
    # The 10 ms of second 1 left the window: 50 ms is the best now, and the cap grew.
    assert lane.cap > 20


def test_with_no_interactive_traffic_batch_takes_what_is_spare() -> None:
    lane = BatchLane(BatchLaneSettings(), backends=1, start=0.0)
    for second in range(1, 60):
        lane.held()
        lane.tick(second, in_flight=int(lane.cap), ceiling=64.0)
    assert lane.cap == 64.0
