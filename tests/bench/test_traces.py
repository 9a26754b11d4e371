"""Replays of the shipped Azure and Mooncake traces."""

from __future__ import annotations

import itertools
import json
import random

from fleetgate.bench.traces import (
    MOONCAKE_BLOCK_TOKENS,
    MOONCAKE_CONV,
    azure_conv,
    first_filler_tokens,
    mooncake_conv,
    open_trace,
)
from fleetgate.bench.workloads import TraceTimes, schedule
from fleetgate.tokens import count_tokens, filler_text


def test_azure_rows_become_requests_with_exact_lengths_and_times() -> None:
    specs = list(itertools.islice(azure_conv(random.Random(0)), 4))
    # The file's first rows: 18:15:46.68059 374/44, 18:15:50.995169 396/109, ...
    assert [(s.prompt_tokens, s.max_tokens) for s in specs] == [
        (374, 44),
        (396, 109),
        (879, 55),
        (91, 16),
    ]
    assert specs[0].at_s == 0.0
    assert abs(specs[1].at_s - 4.314579) < 1e-6
    for spec in specs:
        assert count_tokens(spec.messages[0].content) == spec.prompt_tokens
        assert spec.messages[0].role == "user"


def test_trace_workloads_are_deterministic_for_a_seed() -> None:
    for build in (azure_conv, mooncake_conv):
        a = list(itertools.islice(build(random.Random(3)), 3))
        b = list(itertools.islice(build(random.Random(3)), 3))
        c = list(itertools.islice(build(random.Random(4)), 3))
        assert a == b
        assert a[0].prompt != c[0].prompt


def test_trace_speed_scales_a_real_trace() -> None:
    base = [s.at_s for s in itertools.islice(azure_conv(random.Random(0)), 20)]
    fast = schedule(azure_conv(random.Random(0)), TraceTimes(4.0), random.Random(0))
    assert [s.at_s for s in itertools.islice(fast, 20)] == [t / 4.0 for t in base]


def test_mooncake_equal_hash_id_prefixes_give_equal_text_prefixes() -> None:
    with open_trace(MOONCAKE_CONV) as f:
        rows = [json.loads(line) for line in itertools.islice(f, 40)]
    specs = list(itertools.islice(mooncake_conv(random.Random(5)), 40))
    for row, spec in zip(rows, specs, strict=True):
        assert spec.prompt_tokens == row["input_length"]
        assert spec.max_tokens == row["output_length"]
        assert spec.at_s == row["timestamp"] / 1000.0
    # Rows 0 and 1 share hash id 0 and nothing else: exactly one block of text in common.
    assert rows[0]["hash_ids"][0] == rows[1]["hash_ids"][0] == 0
    assert rows[0]["hash_ids"][1] != rows[1]["hash_ids"][1]
    a, b = specs[0].prompt, specs[1].prompt
    shared = first_filler_tokens(a, MOONCAKE_BLOCK_TOKENS)
    assert b.startswith(shared)
    assert count_tokens(shared) == MOONCAKE_BLOCK_TOKENS
    assert first_filler_tokens(a, MOONCAKE_BLOCK_TOKENS + 1) != first_filler_tokens(
        b, MOONCAKE_BLOCK_TOKENS + 1
    )
    # Every pair sharing its first k hash ids shares k blocks of text (within input lengths).
    for (ra, sa), (rb, sb) in itertools.combinations(list(zip(rows, specs, strict=True))[:15], 2):
        k = 0
        for x, y in zip(ra["hash_ids"], rb["hash_ids"], strict=False):
            if x != y:
                break
            k += 1
        n = min(k * MOONCAKE_BLOCK_TOKENS, ra["input_length"], rb["input_length"])
        assert first_filler_tokens(sa.prompt, n) == first_filler_tokens(sb.prompt, n)


def test_mooncake_prompts_have_exact_token_counts() -> None:
    for spec in itertools.islice(mooncake_conv(random.Random(0)), 5):
        assert count_tokens(spec.prompt) == spec.prompt_tokens


def test_first_filler_tokens_cuts_at_token_boundaries() -> None:
    text = filler_text(10, random.Random(0))
    assert first_filler_tokens(text, 10) == text
    assert count_tokens(first_filler_tokens(text, 3)) == 3
    assert text.startswith(first_filler_tokens(text, 3))
    assert first_filler_tokens(text, 0) == ""
