"""Trace replays: the production traces shipped in fleetgate/bench/traces (see NOTICE.md
there) and a user's own file, read by `fleetgate.bench.tracefile`.

Each is read a line at a time, so an hour of trace costs memory for one request, not all.
Prompts are filler text (fleetgate.tokens) of the trace's exact input length; output length
is the trace's, asked for as max_tokens. Times are seconds after the trace's first request.

- azure-conv: the Azure LLM inference trace 2023, conversation service. No prefix data, so
  every prompt is fresh random filler.
- mooncake-conv: the Mooncake conversation trace. Each hash id names a 512-token prompt block;
  a block's text is filler seeded by the id (and a per-run salt from the injected random), and
  a prompt is its blocks joined and cut to input_length tokens. Equal hash-id prefixes thus
  give equal text prefixes, which is what makes the trace's prefix reuse real for a server's
  prefix cache.
- a user's file (`--trace FILE`): either format, prompts built as for the trace it follows.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import IO

from fleetgate.bench.tracefile import TraceRow, azure_rows, mooncake_rows, read_trace
from fleetgate.bench.workloads import Endpoint, RequestSpec, user_request
from fleetgate.tokens import filler_text

AZURE_CONV = "azure2023_conv.csv"
MOONCAKE_CONV = "mooncake_conversation.jsonl"
# Where each trace comes from, for citing next to results (NOTICE.md asks for it).
TRACE_SOURCES: dict[str, str] = {
    "azure-conv": "Azure LLM inference trace 2023, conversation (Azure/AzurePublicDataset), "
    "(c) Microsoft, CC-BY-4.0",
    "mooncake-conv": "Mooncake conversation trace, FAST'25 (kvcache-ai/Mooncake), "
    "(c) Moonshot AI and the Mooncake authors, Apache-2.0",
}
MOONCAKE_BLOCK_TOKENS = 512
# Blocks kept built: hot prefixes (system prompts, long conversations) stay, the tail goes.
# 4096 blocks of 512 filler tokens is about 10 MB.
MOONCAKE_BLOCK_CACHE = 4096


def open_trace(name: str) -> IO[str]:
    """A shipped trace file, opened for reading text."""
    path = resources.files("fleetgate.bench").joinpath("traces", name)
    return path.open("r", encoding="utf-8")


def azure_conv(rng: random.Random, *, endpoint: Endpoint = "chat") -> Iterator[RequestSpec]:
    """The Azure 2023 conversation trace: TIMESTAMP, ContextTokens, GeneratedTokens per row."""
    with open_trace(AZURE_CONV) as f:
        yield from replay(azure_rows(f, AZURE_CONV), rng, endpoint=endpoint)


def mooncake_conv(
    rng: random.Random,
    *,
    endpoint: Endpoint = "chat",
    block_cache: int = MOONCAKE_BLOCK_CACHE,
) -> Iterator[RequestSpec]:
    """The Mooncake conversation trace, with its hash ids turned into shared prompt blocks."""
    with open_trace(MOONCAKE_CONV) as f:
        rows = mooncake_rows(f, MOONCAKE_CONV)
        yield from replay(rows, rng, endpoint=endpoint, block_cache=block_cache)


def trace_file(
    path: Path, rng: random.Random, *, endpoint: Endpoint = "chat"
) -> Iterator[RequestSpec]:
    """A user's own trace file, in either format (see fleetgate.bench.tracefile)."""
    return replay(read_trace(path), rng, endpoint=endpoint)


def replay(
    rows: Iterable[TraceRow],
    rng: random.Random,
    *,
    endpoint: Endpoint = "chat",
    block_cache: int = MOONCAKE_BLOCK_CACHE,
) -> Iterator[RequestSpec]:
    """Trace rows as requests: filler prompts of the rows' lengths, built from prompt blocks
    where a row names them (the first such row draws the run's block salt from `rng`)."""
    blocks: PromptBlocks | None = None
    for row in rows:
        text = ""
        if row.hash_ids:
            blocks = blocks or PromptBlocks(rng.getrandbits(64), block_cache)
            text = blocks.prompt(row.hash_ids, row.input_tokens)
        covered = min(row.input_tokens, len(row.hash_ids) * MOONCAKE_BLOCK_TOKENS)
        if covered < row.input_tokens:
            # More input than blocks (not in the shipped traces): the rest is unshared.
            text += filler_text(row.input_tokens - covered, rng)
        yield user_request(row.at_s, text, row.input_tokens, row.output_tokens, endpoint)


class PromptBlocks:
    """The text of each hash id's 512-token prompt block, the hot ones kept built."""

    def __init__(self, salt: int, cache_size: int) -> None:
        # A distinct seed per hash id within this run: salt is fixed, so ids never collide.
        self.block = functools.lru_cache(maxsize=cache_size)(self._build)
        self._salt = salt

    def _build(self, hash_id: int) -> str:
        return filler_text(MOONCAKE_BLOCK_TOKENS, random.Random(self._salt ^ hash_id))

    def prompt(self, hash_ids: Iterable[int], tokens: int) -> str:
        """The blocks joined and cut to `tokens` tokens."""
        parts: list[str] = []
        left = tokens
        for hash_id in hash_ids:
            if left <= 0:
                break
            text = self.block(hash_id)
            if left < MOONCAKE_BLOCK_TOKENS:
                text = first_filler_tokens(text, left)
            parts.append(text)
            left -= MOONCAKE_BLOCK_TOKENS
        return "".join(parts)


def first_filler_tokens(text: str, n: int) -> str:
    """The first `n` tokens of a filler text (every filler token is ' word')."""
    # " a b c".split(" ", 3) == ["", "a", "b", "c"]: n words need n + 1 leading parts.
    return " ".join(text.split(" ", n + 1)[: n + 1])
