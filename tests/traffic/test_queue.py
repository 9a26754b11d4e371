"""The fair queue: tokens through in proportion to weights, in arrival order per tenant."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from fleetgate.traffic.queue import FairQueue


@dataclass
class Entry:
    tenant: str
    cost: float
    n: int = 0
    gone: bool = False


def drain(queue: FairQueue[Entry], count: int) -> list[Entry]:
    out = []
    for _ in range(count):
        entry = queue.pop()
        if entry is None:
            break
        out.append(entry)
    return out


def test_two_equal_tenants_alternate_whoever_came_first() -> None:
    queue: FairQueue[Entry] = FairQueue()
    for i in range(100):
        queue.push(Entry("a", 10, i), 1.0)
    for i in range(100):
        queue.push(Entry("b", 10, i), 1.0)
    served = drain(queue, 100)
    assert Counter(e.tenant for e in served) == {"a": 50, "b": 50}
    assert [e.n for e in served if e.tenant == "a"] == list(range(50))  # in order


def test_tokens_not_requests_are_shared_so_long_prompts_cannot_starve_short_ones() -> None:
    queue: FairQueue[Entry] = FairQueue()
    for _ in range(200):
        queue.push(Entry("long", 8000, 0), 1.0)
        queue.push(Entry("short", 1000, 0), 1.0)
    served = drain(queue, 90)
    tokens = Counter[str]()
    for e in served:
        tokens[e.tenant] += int(e.cost)
    assert abs(tokens["long"] - tokens["short"]) <= 8000
    assert Counter(e.tenant for e in served)["short"] >= 70


def test_weights_share_in_proportion() -> None:
    queue: FairQueue[Entry] = FairQueue()
    for _ in range(300):
        queue.push(Entry("heavy", 1, 0), 3.0)
        queue.push(Entry("light", 1, 0), 1.0)
    counts = Counter(e.tenant for e in drain(queue, 200))
    assert counts["heavy"] == 150 and counts["light"] == 50


def test_a_tenant_back_from_idle_has_no_credit_saved_up() -> None:
    queue: FairQueue[Entry] = FairQueue()
    for _ in range(50):
        queue.push(Entry("busy", 1, 0), 1.0)
    drain(queue, 40)  # "idle" sent nothing meanwhile
    for _ in range(20):
        queue.push(Entry("idle", 1, 0), 1.0)
    counts = Counter(e.tenant for e in drain(queue, 10))
    assert counts == {"busy": 5, "idle": 5}


def test_a_held_tenant_waits_without_holding_up_the_others() -> None:
    queue: FairQueue[Entry] = FairQueue()
    for _ in range(5):
        queue.push(Entry("capped", 1, 0), 1.0)
        queue.push(Entry("free", 1, 0), 1.0)
    queue.hold("capped")
    assert {e.tenant for e in drain(queue, 10)} == {"free"}
    queue.release("capped")
    assert [e.tenant for e in drain(queue, 10)] == ["capped"] * 5


def test_gone_entries_are_skipped_and_swept() -> None:
    queue: FairQueue[Entry] = FairQueue()
    entries = [Entry("a", 1, i) for i in range(10)]
    for e in entries:
        queue.push(e, 1.0)
    for e in entries[:8]:
        e.gone = True
    assert [e.n for e in drain(queue, 5)] == [8, 9]
    for e in entries:
        queue.push(Entry("b", 1, e.n, gone=e.n < 5), 1.0)
    queue.forget_gone()
    assert len(queue) == 5
    newest = queue.remove_newest()
    assert newest is not None and newest.n == 9


def test_ahead_counts_what_the_fair_order_serves_first() -> None:
    queue: FairQueue[Entry] = FairQueue()
    for _ in range(10):
        queue.push(Entry("heavy", 1), 1.0)
    queue.push(Entry("light", 1), 1.0)
    assert queue.ahead("new") == 2  # the first of each: started at the same virtual time
    assert queue.ahead("light") == 3  # its own, and heavy's first two
    assert queue.ahead("heavy") == 11  # every one queued


def test_a_request_that_left_unserved_costs_its_tenant_no_place() -> None:
    queue: FairQueue[Entry] = FairQueue()
    timed_out = [Entry("a", 1) for _ in range(5)]
    for e in timed_out:
        queue.push(e, 1.0)
    queue.push(Entry("b", 1), 1.0)
    for e in timed_out:
        e.gone = True
    queue.push(Entry("a", 1, 5), 1.0)
    # a's five never ran: its next request goes as early as b's first, not behind five more
    served = drain(queue, 2)
    assert {(e.tenant, e.n) for e in served} == {("a", 5), ("b", 0)}


def test_a_tenant_whose_oldest_requests_time_out_keeps_its_share() -> None:
    """Two equal tenants, both with a backlog; the first half of a's time out while they
    wait. What is left of a's is served alternately with b's, not after b's first five (the
    tags of a's waiting requests do not keep the places of those that left)."""
    queue: FairQueue[Entry] = FairQueue()
    a_entries = [Entry("a", 1, i) for i in range(10)]
    for a in a_entries:
        queue.push(a, 1.0)
        queue.push(Entry("b", 1), 1.0)
    for a in a_entries[:5]:
        a.gone = True
    counts = Counter(e.tenant for e in drain(queue, 10))
    assert counts == {"a": 5, "b": 5}
