"""What the block manager tells its listener: what vLLM's KV events report."""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.workers.sim.kvcache import BlockManager, Pieces


class Heard:
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def stored(self, hashes: Sequence[int], parent: int | None, pieces: Pieces) -> None:
        self.events.append(("stored", (list(hashes), parent, list(pieces))))

    def removed(self, block_hash: int) -> None:
        self.events.append(("removed", block_hash))

    def cleared(self) -> None:
        self.events.append(("cleared", None))


PIECES = [f"t{i}" for i in range(8)]


def test_blocks_are_told_as_they_fill_chained_on_the_block_before() -> None:
    heard = Heard()
    kv = BlockManager(4, 2, heard)
    assert kv.allocate("a", [1, 2, 3], 3, 0, 3, pieces=PIECES[:6])  # block 0 full, 1 half
    assert kv.append_slots("a", 6)  # blocks 1 and 2 fill
    assert heard.events == [
        ("stored", ([1], None, PIECES[0:2])),
        ("stored", ([2, 3], 1, PIECES[2:6])),
    ]


def test_a_block_already_cached_splits_the_run_and_evictions_and_resets_are_told() -> None:
    heard = Heard()
    kv = BlockManager(3, 2, heard)
    assert kv.allocate("a", [1, 2], 4, 0, 4, pieces=PIECES[:4])
    kv.free("a")
    heard.events.clear()
    # Block 1 was cached by "a": "b" reuses it; its second block is new, chained on it.
    assert kv.allocate("b", [1, 5], 4, 1, 4, pieces=[*PIECES[:2], "x", "y"])
    assert heard.events == [("stored", ([5], 1, ["x", "y"]))]
    kv.free("b")
    heard.events.clear()
    assert kv.allocate("c", [7, 8, 9], 6, 0, 6)  # no pieces: stored is told without tokens
    assert ("removed", 5) in heard.events  # evicted to make room
    assert ("stored", ([7, 8, 9], None, [])) in heard.events
    kv.free("c")
    heard.events.clear()
    assert kv.reset_prefix_cache()
    assert heard.events == [("cleared", None)]
