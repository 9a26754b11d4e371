"""Replays of the production traces shipped in fleetgate/bench/traces (see NOTICE.md there).

Both are read a line at a time, so an hour of trace costs memory for one request, not all.
Prompts are filler text (fleetgate.tokens) of the trace's exact input length; output length
is the trace's, asked for as max_tokens. Times are seconds after the trace's first request.

- azure-conv: the Azure LLM inference trace 2023, conversation service. No prefix data, so
  every prompt is fresh random filler.
- mooncake-conv: the Mooncake conversation trace. Each hash id names a 512-token prompt block;
  a block's text is filler seeded by the id (and a per-run salt from the injected random), and
  a prompt is its blocks joined and cut to input_length tokens. Equal hash-id prefixes thus
  give equal text prefixes, which is what makes the trace's prefix reuse real for a server's
  prefix cache.
"""

from __future__ import annotations

import csv
import functools
import random
from collections.abc import Iterator
from datetime import datetime
from importlib import resources
from typing import IO

import msgspec

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
        rows = csv.reader(f)
        header = next(rows)
        if header[:3] != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
            raise ValueError(f"unexpected header in {AZURE_CONV}: {header}")
        start: datetime | None = None
        for stamp, context_tokens, generated_tokens in rows:
            # Seven fractional digits: fromisoformat (3.11+) keeps the first six.
            when = datetime.fromisoformat(stamp)
            if start is None:
                start = when
            n_in = int(context_tokens)
            yield user_request(
                (when - start).total_seconds(),
                filler_text(n_in, rng),
                n_in,
                int(generated_tokens),
                endpoint,
            )


class _MooncakeRow(msgspec.Struct):
    timestamp: int  # ms after the trace's start
    input_length: int
    output_length: int
    hash_ids: list[int]


def mooncake_conv(
    rng: random.Random,
    *,
    endpoint: Endpoint = "chat",
    block_cache: int = MOONCAKE_BLOCK_CACHE,
) -> Iterator[RequestSpec]:
    """The Mooncake conversation trace, with its hash ids turned into shared prompt blocks."""
    salt = rng.getrandbits(64)

    @functools.lru_cache(maxsize=block_cache)
    def block(hash_id: int) -> str:
        # A distinct seed per hash id within this run: salt is fixed, so ids never collide.
        return filler_text(MOONCAKE_BLOCK_TOKENS, random.Random(salt ^ hash_id))

    decoder = msgspec.json.Decoder(_MooncakeRow)
    with open_trace(MOONCAKE_CONV) as f:
        for line in f:
            if not line.strip():
                continue
            row = decoder.decode(line)
            parts: list[str] = []
            left = row.input_length
            for hash_id in row.hash_ids:
                if left <= 0:
                    break
                text = block(hash_id)
                if left < MOONCAKE_BLOCK_TOKENS:
                    text = first_filler_tokens(text, left)
                parts.append(text)
                left -= MOONCAKE_BLOCK_TOKENS
            if left > 0:
                # More input than blocks (not in the shipped trace): the rest is unshared.
                parts.append(filler_text(left, rng))
            yield user_request(
                row.timestamp / 1000.0,
                "".join(parts),
                row.input_length,
                row.output_length,
                endpoint,
            )


def first_filler_tokens(text: str, n: int) -> str:
    """The first `n` tokens of a filler text (every filler token is ' word')."""
    # " a b c".split(" ", 3) == ["", "a", "b", "c"]: n words need n + 1 leading parts.
    return " ".join(text.split(" ", n + 1)[: n + 1])
