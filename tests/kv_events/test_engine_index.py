"""The blocks each engine reports: chained by their tokens, removed by the engine's hashes."""

from __future__ import annotations

from fleetgate.kv_events.index import PENDING_S, EngineBlockIndex, token_keys
from fleetgate.kv_events.wire import Cleared, Removed, Stored

BS = 4
PROMPT = list(range(100, 114))  # 3 full blocks and 2 tokens


def stored(hashes: tuple[int, ...], parent: int | None, first: int, **kw: object) -> Stored:
    """Blocks of PROMPT from block `first` on, under the engine's `hashes`."""
    ids = tuple(PROMPT[first * BS : (first + len(hashes)) * BS])
    return Stored(hashes, parent, ids, BS, **kw)  # type: ignore[arg-type]


def test_a_prompt_matches_the_blocks_an_engine_stored_in_two_events() -> None:
    index = EngineBlockIndex(1000)
    assert not index.follows("a")
    index.apply("a", [stored((11, 12), None, 0)])
    index.apply("a", [stored((13,), 12, 2)])  # chained on the engine's hash of block 1
    assert index.follows("a")
    assert index.blocks("a") == 3
    assert index.matches(PROMPT, ["a", "b"], 0.0) == {"a": 12}
    other = [*PROMPT[:5], 999, *PROMPT[6:]]  # differs in block 1
    assert index.matches(other, ["a"], 0.0) == {"a": 4}


def test_removal_by_the_engines_hash_and_a_reset_forget_blocks() -> None:
    index = EngineBlockIndex(1000)
    index.apply("a", [stored((11, 12, 13), None, 0)])
    index.apply("b", [stored((21, 22), None, 0)])
    index.apply("a", [Removed((12, 99))])  # an unknown hash is ignored
    assert index.matches(PROMPT, ["a", "b"], 0.0) == {"a": 4, "b": 8}
    index.apply("b", [Cleared()])
    assert index.follows("b")  # it told: it holds nothing
    assert index.matches(PROMPT, ["a", "b"], 0.0) == {"a": 4}


def test_an_orphan_a_lora_and_an_offloaded_block_are_not_indexed() -> None:
    index = EngineBlockIndex(1000)
    index.apply("a", [stored((12,), 11, 1)])  # its parent was never heard
    index.apply("a", [stored((31,), None, 0, lora="sql")])
    index.apply("a", [stored((41,), None, 0, medium="CPU")])
    assert index.orphans == 1
    assert index.matches(PROMPT, ["a"], 0.0) == {}


def test_forget_drops_a_backend_until_it_reports_again() -> None:
    index = EngineBlockIndex(1000)
    index.apply("a", [stored((11,), None, 0)])
    index.forget("a")
    assert not index.follows("a")
    assert index.matches(PROMPT, ["a"], 0.0) == {}


def test_keys_chain_so_equal_keys_mean_equal_prefixes() -> None:
    a = token_keys(PROMPT, BS)
    b = token_keys([*PROMPT[:4], 0, *PROMPT[5:]], BS)
    assert len(a) == 3
    assert a[0] == b[0]
    assert a[1] != b[1]
    assert a[2] != b[2]  # block 2 is equal, its prefix is not


def test_an_engine_that_never_reports_evicting_costs_a_bounded_memory() -> None:
    index = EngineBlockIndex(10)
    parent = None
    for i in range(100):  # 100 blocks, chained, never removed
        index.apply("a", [Stored((i,), parent, (i,) * BS, BS)])
        parent = i
    assert index.blocks("a") == 10


def test_a_prompt_sent_counts_as_held_until_its_engine_reports_it_or_time_passes() -> None:
    index = EngineBlockIndex(1000)
    index.apply("a", [stored((11,), None, 0), Cleared()])  # followed, holding nothing
    assert index.matches(PROMPT, ["a"], 5.0) == {}
    index.expect("a", PROMPT, now=5.0)
    assert index.matches(PROMPT, ["a"], 5.0) == {"a": 12}
    assert index.matches(PROMPT, ["a"], 5.0 + PENDING_S) == {}  # never reported: not held
    index.expect("a", PROMPT, now=10.0)
    index.apply("a", [stored((11, 12, 13), None, 0)])  # reported: held whatever the time
    assert index.matches(PROMPT, ["a"], 10.0 + PENDING_S) == {"a": 12}
    index.expect("b", PROMPT, now=10.0)  # a backend not followed: nothing expected
    assert index.matches(PROMPT, ["b"], 10.0) == {}


def test_a_block_expected_then_reported_then_evicted_is_gone_at_once() -> None:
    index = EngineBlockIndex(1000)
    index.apply("a", [stored((9,), None, 0)])  # followed
    index.apply("a", [Removed((9,))])
    index.expect("a", PROMPT, 0.0)
    assert index.matches(PROMPT, ["a"], 0.1) == {"a": 3 * BS}  # expected
    index.apply("a", [stored((11, 12, 13), None, 0)])  # reported
    index.apply("a", [Removed((11, 12, 13))])  # and evicted, well within PENDING_S
    assert index.matches(PROMPT, ["a"], 0.2) == {}
