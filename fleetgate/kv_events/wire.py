"""KV-cache event batches as vLLM's and SGLang's ZMQ publishers send them.

A PUB message is three frames: the topic, an 8-byte big-endian sequence number, and a msgpack
batch `[ts, events, data_parallel_rank]`. Each event comes in one of two encodings:
- a positional array tagged by its first item (vLLM before its PR #42892 of June 2026, and
  SGLang before #37271):
      ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...]
      ["BlockRemoved", block_hashes, medium, ...]
      ["AllBlocksCleared"]
- a map with the tag under "type" and the same fields by name (vLLM and SGLang since).
Fields either form adds later are ignored, and a map's trailing fields may be absent. A block
hash is an integer (vLLM's builtin hashes are unsigned 64-bit, others signed: both are read as
unsigned) or bytes (sha256 hashing). An event of a type this module does not know is skipped.

A batch that is not msgpack, or an event that lacks a field it needs or has one of the wrong
type, raises `WireError`: the caller counts it and drops the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

BlockHash = int | bytes
Encoding = Literal["array", "map"]
ENCODINGS: tuple[Encoding, ...] = ("array", "map")
_MASK = (1 << 64) - 1


class WireError(ValueError):
    """A batch this module cannot read."""


@dataclass(frozen=True, slots=True)
class Stored:
    """Blocks the engine computed and now holds, each chained on the one before it."""

    hashes: tuple[BlockHash, ...]
    parent: BlockHash | None  # the block before the first one; None: they start the prompt
    token_ids: tuple[int, ...]  # block_size tokens per block
    block_size: int
    lora: str | int | None = None  # the adapter they were computed for; None: the base model
    medium: str | None = None  # where they live: None or "GPU", or an offload tier ("CPU")


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: tuple[BlockHash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class Cleared:
    """The engine dropped every block (a cache reset)."""


Event = Stored | Removed | Cleared


@dataclass(frozen=True, slots=True)
class Batch:
    ts: float  # when the engine published it (its wall clock, seconds since the epoch)
    events: tuple[Event, ...]
    rank: int | None = None  # data-parallel rank


def decode_batch(payload: bytes) -> Batch:
    """The batch in `payload`, in either encoding; WireError when it cannot be read."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise WireError(f"not msgpack: {exc}") from None
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise WireError("a batch is [ts, events, data_parallel_rank]")
    ts, items = raw[0], raw[1]
    rank = raw[2] if len(raw) > 2 else None
    if not isinstance(ts, int | float) or not (rank is None or isinstance(rank, int)):
        raise WireError("a batch's ts is a number and its rank an integer or null")
    events = []
    for item in items:
        event = _event(item)
        if event is not None:
            events.append(event)
    return Batch(float(ts), tuple(events), rank)


_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
_REMOVED = ("block_hashes", "medium")


def _event(item: Any) -> Event | None:
    if isinstance(item, list) and item and isinstance(item[0], str):
        kind, fields = item[0], item[1:]
    elif isinstance(item, dict) and isinstance(item.get("type"), str):
        kind = item["type"]
        names = _STORED if kind == "BlockStored" else _REMOVED
        fields = [item.get(name) for name in names]
        if kind == "BlockStored" and item.get("lora_name") is not None:
            fields[4] = item["lora_name"]
    else:
        raise WireError("an event is an array tagged by its first item or a map with a type")
    if kind == "BlockStored":
        return _stored(fields)
    if kind == "BlockRemoved":
        if not fields:
            raise WireError("BlockRemoved without block_hashes")
        return Removed(_hashes(fields[0]), _medium(fields, 1))
    if kind == "AllBlocksCleared":
        return Cleared()
    return None


def _stored(fields: list[Any]) -> Stored:
    if len(fields) < 4:
        raise WireError("BlockStored needs block_hashes, parent_block_hash, token_ids, block_size")
    hashes, parent, token_ids, block_size = fields[:4]
    if not isinstance(block_size, int) or block_size < 1:
        raise WireError("BlockStored's block_size is a positive integer")
    if not isinstance(token_ids, list) or not all(
        isinstance(t, int) and 0 <= t <= _MASK >> 1 for t in token_ids
    ):
        raise WireError("BlockStored's token_ids are integers >= 0")
    lora = fields[4] if len(fields) > 4 else None
    if not (lora is None or isinstance(lora, str | int)):
        raise WireError("BlockStored's lora is an id, a name or null")
    blocks = _hashes(hashes)
    if len(token_ids) != len(blocks) * block_size:
        raise WireError("BlockStored carries block_size token ids per block")
    return Stored(
        blocks, None if parent is None else _hash(parent), tuple(token_ids), block_size,
        lora, _medium(fields, 5),
    )  # fmt: skip


def _hashes(value: Any) -> tuple[BlockHash, ...]:
    if not isinstance(value, list):
        raise WireError("block_hashes is an array")
    return tuple(_hash(h) for h in value)


def _hash(value: Any) -> BlockHash:
    if isinstance(value, bool) or not isinstance(value, int | bytes):
        raise WireError("a block hash is an integer or bytes")
    return value & _MASK if isinstance(value, int) else value


def _medium(fields: list[Any], at: int) -> str | None:
    medium = fields[at] if len(fields) > at else None
    if not (medium is None or isinstance(medium, str)):
        raise WireError("medium is a string or null")
    return medium


def encode_batch(batch: Batch, encoding: Encoding) -> bytes:
    """`batch` as a publisher sends it, its events in `encoding` (the sim worker's)."""
    events = [_encode_event(e, encoding) for e in batch.events]
    return msgspec.msgpack.encode([batch.ts, events, batch.rank])


def _encode_event(event: Event, encoding: Encoding) -> list[Any] | dict[str, Any]:
    if isinstance(event, Stored):
        kind = "BlockStored"
        values: Sequence[Any] = (
            list(event.hashes), event.parent, list(event.token_ids), event.block_size,
            event.lora, event.medium,
        )  # fmt: skip
        names: Sequence[str] = _STORED
    elif isinstance(event, Removed):
        kind, values, names = "BlockRemoved", (list(event.hashes), event.medium), _REMOVED
    else:
        kind, values, names = "AllBlocksCleared", (), ()
    if encoding == "array":
        return [kind, *values]
    return {"type": kind, **dict(zip(names, values, strict=True))}
