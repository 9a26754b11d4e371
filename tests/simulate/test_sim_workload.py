"""The simulator's workloads (simulate/workload.py): traces read as lengths and blocks, more
users as copies of a trace, prompts as routing sees them."""

from __future__ import annotations

import itertools
import random

import pytest

from fleetgate.routing.base import BYTES_PER_TOKEN
from fleetgate.simulate.workload import (
    BLOCK_TOKENS,
    SimRequest,
    WorkloadSettings,
    prompt_bytes,
    requests,
)


def first(settings: WorkloadSettings, n: int) -> list[SimRequest]:
    return list(itertools.islice(requests(settings, ["here"], random.Random(1)), n))


def test_a_trace_is_its_rows_lengths_and_blocks() -> None:
    (r,) = first(WorkloadSettings(name="mooncake-conv"), 1)
    assert r.at_s == 0.0 and len(r.blocks) == -(-r.prompt_tokens // BLOCK_TOKENS)
    prompt = prompt_bytes(r)
    assert len(prompt) == r.prompt_tokens * BYTES_PER_TOKEN  # the gateway's estimate: exact


def test_prompts_share_bytes_exactly_as_far_as_they_share_blocks() -> None:
    rows = first(WorkloadSettings(name="mooncake-conv"), 200)
    a, b = next((a, b) for a, b in itertools.combinations(rows, 2) if a.blocks[0] == b.blocks[0]
                and a.blocks != b.blocks)  # fmt: skip
    shared = next(i for i, (x, y) in enumerate(zip(a.blocks, b.blocks, strict=False)) if x != y)
    pa, pb = prompt_bytes(a), prompt_bytes(b)
    same = next(i for i, (x, y) in enumerate(zip(pa, pb, strict=False)) if x != y)
    block = BLOCK_TOKENS * BYTES_PER_TOKEN
    assert shared * block <= same < shared * block + 8  # in the next block's id, its start


def test_more_users_replay_the_trace_as_copies_of_their_own_in_time_order() -> None:
    one = first(WorkloadSettings(name="mooncake-conv"), 100_000)
    four = first(WorkloadSettings(name="mooncake-conv", users=4), 100_000)
    assert len(four) == 4 * len(one)  # over the trace's hour, each copy whole
    times = [r.at_s for r in four]
    assert times == sorted(times)
    # Copies share no prompt block: a copy is other people.
    by_copy: dict[int, set[int]] = {}
    for r in four:
        for block in r.blocks:
            by_copy.setdefault(block >> 48, set()).add(block)
    assert len(by_copy) == 4
    assert all(not a & b for a, b in itertools.combinations(by_copy.values(), 2))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"users": 0}, "workload.users must be in 1..10000"),
        ({"name": "synthetic", "users": 2}, "workload.users replays a trace"),
        ({"name": "trace"}, "a trace file is replayed"),
        ({"rate": float("inf")}, "workload.rate"),
    ],
)
def test_a_wrong_workload_is_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadSettings(**settings)  # type: ignore[arg-type]
