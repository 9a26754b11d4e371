"""What a gateway sent its engines and they have not reported yet, shared through a real Redis
(shared/engine_blocks.py): another gateway counts those blocks held as the sender does, until
the same moment; an expectation older than PENDING_S when heard (a gateway starting, reading
the stream's past, or a clock that disagrees: counted) is not held; nothing is published
for a backend whose engine is not followed."""

from __future__ import annotations

from typing import Any

from fleetgate.kv_events.index import PENDING_S, EngineBlockIndex
from fleetgate.kv_events.wire import Removed
from fleetgate.shared.engine_blocks import SharedEngineBlocks
from tests.kv_events.test_engine_index import BS, PROMPT, stored

KEY = "test:expected:m"


class Clocks:
    """The routing clock and the wall clock of one gateway, moved by hand (the wall clock
    starts elsewhere: the two gateways agree on it, not on their monotonic clocks)."""

    def __init__(self, now: float, wall: float) -> None:
        self.t, self.w = now, wall

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.w

    def move(self, seconds: float) -> None:
        self.t += seconds
        self.w += seconds


def gateway(client: Any, name: str, clocks: Clocks) -> tuple[EngineBlockIndex, SharedEngineBlocks]:
    index = EngineBlockIndex(1000)
    index.apply("a", [stored((1,), None, 0)])  # follows a's engine, which holds block 0
    index.apply("b", [stored((2,), None, 0)])
    shared = SharedEngineBlocks(index, client.execute_command, KEY, name, clocks.now,
                                clocks.wall)  # fmt: skip
    return index, shared


async def test_another_gateway_holds_what_one_sent_until_the_same_moment(client: Any) -> None:
    one, two = Clocks(10.0, 5000.0), Clocks(777.0, 5000.0)
    _, a = gateway(client, "gw-1", one)
    _, b = gateway(client, "gw-2", two)
    a.expect("a", PROMPT, one.now())  # 3 full blocks sent to a
    assert a.matches(PROMPT, ["a", "b"], one.now()) == {"a": 3 * BS, "b": BS}
    assert b.matches(PROMPT, ["a", "b"], two.now()) == {"a": BS, "b": BS}  # not heard yet
    one.move(0.5)
    two.move(0.5)
    assert await a.sync() and await b.sync()
    assert b.matches(PROMPT, ["a", "b"], two.now()) == {"a": 3 * BS, "b": BS}
    assert b.deepest(PROMPT, 1, two.now()) == ["a"]
    two.move(PENDING_S - 0.5 - 0.01)
    assert b.matches(PROMPT, ["a"], two.now()) == {"a": 3 * BS}
    two.move(0.02)  # PENDING_S after it was sent, by the wall clock they share
    assert b.matches(PROMPT, ["a"], two.now()) == {"a": BS}


async def test_an_expectation_already_past_is_not_held(client: Any) -> None:
    one, two = Clocks(0.0, 9000.0), Clocks(0.0, 9000.0)
    _, a = gateway(client, "gw-1", one)
    a.expect("a", PROMPT, one.now())
    assert await a.sync()
    two.move(PENDING_S + 0.1)  # a gateway starting later reads the stream's past
    _, late = gateway(client, "gw-late", two)
    assert await late.sync()
    assert late.stream.heard == 1
    assert late.stream.stale == 0  # sent before it started: the stream's past, not a fault
    assert late.matches(PROMPT, ["a"], two.now()) == {"a": BS}


async def test_an_expectation_heard_late_from_a_skewed_clock_is_counted(client: Any) -> None:
    """A gateway whose wall clock runs more than PENDING_S ahead of its peer's finds every
    expectation it hears already past: none is held, and each one is counted (once it has
    been up longer than the skew), so the skew shows."""
    one, two = Clocks(0.0, 9000.0), Clocks(0.0, 9000.0 + PENDING_S + 1.0)
    _, a = gateway(client, "gw-1", one)
    _, ahead = gateway(client, "gw-ahead", two)
    assert await ahead.sync()  # started, and has read the stream's (empty) past
    one.move(2 * PENDING_S)  # both up for longer than their clocks disagree
    two.move(2 * PENDING_S)
    a.expect("a", PROMPT, one.now())
    assert await a.sync() and await ahead.sync()
    assert ahead.stream.heard == 1 and ahead.stream.stale == 1
    assert ahead.matches(PROMPT, ["a"], two.now()) == {"a": BS}


async def test_nothing_is_told_of_a_backend_not_followed(client: Any) -> None:
    one = Clocks(0.0, 100.0)
    _, a = gateway(client, "gw-1", one)
    a.expect("unfollowed", PROMPT, one.now())
    assert await a.sync()
    assert await client.xlen(KEY) == 0


def test_an_expectation_that_lapses_first_lapses_first_whatever_the_order() -> None:
    index = EngineBlockIndex(1000)
    index.apply("a", [stored((1,), None, 0)])
    index.apply("b", [stored((2,), None, 0)])
    index.expect("a", PROMPT, 0.0)  # until PENDING_S
    index.hold("b", index.keys_for("b", PROMPT), 0.5, 0.0)  # heard late: lapses sooner
    assert index.matches(PROMPT, ["a", "b"], 0.4) == {"a": 3 * BS, "b": 3 * BS}
    assert index.matches(PROMPT, ["a", "b"], 0.6) == {"a": 3 * BS, "b": BS}


def test_a_block_two_prompts_share_stays_expected_until_the_later_lapses() -> None:
    index = EngineBlockIndex(1000)
    index.apply("a", [stored((1,), None, 0)])
    index.expect("a", PROMPT, 0.0)
    index.expect("a", PROMPT[: 2 * BS], 1.0)  # its first two blocks sent again
    assert index.matches(PROMPT, ["a"], PENDING_S + 0.5) == {"a": 2 * BS}
    assert index.matches(PROMPT, ["a"], PENDING_S + 1.5) == {"a": BS}  # the engine's own


def test_expectations_heard_lapse_even_at_a_gateway_that_routes_nothing() -> None:
    index = EngineBlockIndex(1000)
    index.apply("a", [stored((1,), None, 0)])
    keys = index.keys_for("a", PROMPT)
    for n in range(100):  # heard from the others, never looked up here
        index.hold("a", keys, n * 0.1 + PENDING_S, n * 0.1)
    assert len(index._expiring) <= PENDING_S / 0.1 + 1


def test_an_expected_block_the_engine_evicts_is_gone_at_once() -> None:
    index = EngineBlockIndex(1000)
    index.apply("a", [stored((11, 12, 13), None, 0)])  # held, then sent again
    index.expect("a", PROMPT, 0.0)
    index.apply("a", [Removed((12, 13))])
    assert index.matches(PROMPT, ["a"], 0.1) == {"a": BS}
