"""Both encodings of vLLM's and SGLang's KV-event batches, fields added later, and refusals."""

from __future__ import annotations

import msgspec
import pytest

from fleetgate.kv_events.wire import (
    ENCODINGS,
    Batch,
    Cleared,
    Encoding,
    Removed,
    Stored,
    WireError,
    decode_batch,
    encode_batch,
)

STORED = Stored((1, 2), None, tuple(range(8)), 4, None, "GPU")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_batch_reads_back_in_either_encoding(encoding: Encoding) -> None:
    batch = Batch(1.5, (STORED, Removed((3,), "GPU"), Cleared()), 0)
    assert decode_batch(encode_batch(batch, encoding)) == batch


def test_a_map_event_as_vllm_sends_it_since_june_2026_with_fields_added() -> None:
    # The shape of a batch captured from vLLM 0.26 (volcano-sh/kthena#1535): an unsigned
    # 64-bit hash, and fields this module does not know.
    payload = msgspec.msgpack.encode([1789095808.8, [{
        "type": "BlockStored", "block_hashes": [15760518052499183552], "parent_block_hash": None,
        "token_ids": list(range(16)), "block_size": 16, "lora_id": None, "medium": "GPU",
        "lora_name": None, "extra_keys": [None], "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }], 0])  # fmt: skip
    (event,) = decode_batch(payload).events
    assert event == Stored((15760518052499183552,), None, tuple(range(16)), 16, None, "GPU")


def test_an_array_event_with_trailing_fields_and_signed_or_bytes_hashes() -> None:
    payload = msgspec.msgpack.encode([2.0, [
        ["BlockStored", [-1, b"\x01" * 32], 7, [5, 6, 7, 8], 2, None, "GPU", "lora", [None], 0],
        ["BlockRemoved", [-1], "GPU", "extra"],
        ["AllBlocksCleared"],
    ], None])  # fmt: skip
    stored, removed, cleared = decode_batch(payload).events
    assert stored == Stored((2**64 - 1, b"\x01" * 32), 7, (5, 6, 7, 8), 2, None, "GPU")
    assert removed == Removed((2**64 - 1,), "GPU")
    assert cleared == Cleared()


def test_a_lora_name_in_a_map_names_the_adapter() -> None:
    payload = msgspec.msgpack.encode([1.0, [{
        "type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
        "token_ids": [1, 2], "block_size": 2, "lora_id": 3, "lora_name": "sql-adapter",
    }]])  # fmt: skip
    (event,) = decode_batch(payload).events
    assert isinstance(event, Stored)
    assert event.lora == "sql-adapter"
    assert event.medium is None


def test_an_event_of_an_unknown_type_is_skipped() -> None:
    payload = msgspec.msgpack.encode([1.0, [["BlockMoved", [1]], {"type": "Other"}], 0])
    assert decode_batch(payload).events == ()


@pytest.mark.parametrize(
    "raw",
    [
        b"\xc1not msgpack",
        msgspec.msgpack.encode({"ts": 1.0}),  # not [ts, events, rank]
        msgspec.msgpack.encode([1.0, [5]]),  # an event neither array nor map
        msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, [1, 2, 3], 2]]]),  # ids != 2
        msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, [-1, 2], 2]]]),  # id < 0
        msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, [1, 2], 0]]]),  # size 0
        msgspec.msgpack.encode([1.0, [["BlockStored", [True], None, [1, 2], 2]]]),  # a bool
        msgspec.msgpack.encode([1.0, [["BlockRemoved"]]]),
        msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": "1"}]]),
        msgspec.msgpack.encode(["now", []]),
    ],
)
def test_what_cannot_be_read_is_refused(raw: bytes) -> None:
    with pytest.raises(WireError):
        decode_batch(raw)
