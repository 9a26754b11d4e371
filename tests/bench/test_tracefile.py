"""Reading a user's trace file: both formats, told apart, and bad rows named by line."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from fleetgate.bench.tracefile import (
    TraceError,
    TraceInfo,
    TraceRow,
    check_trace,
    detect_format,
    read_trace,
)
from fleetgate.bench.traces import MOONCAKE_BLOCK_TOKENS, first_filler_tokens, trace_file
from fleetgate.tokens import count_tokens

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens,Deployment\r\n"
    "2023-11-16 18:15:46.6805900,374,44,a\r\n"
    "2023-11-16 18:15:50.9951690,396,0,b\r\n"
    "\r\n"
    "2023-11-16 18:15:50.9951690,12,7,c\r\n"
)
MOONCAKE = (
    '{"timestamp": 5000, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}\n'
    '{"timestamp": 5250, "input_length": 1100, "output_length": 9, "hash_ids": [7, 9]}\n'
    "\n"
    '{"timestamp": 6000, "input_length": 20, "output_length": 1}\n'
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_an_azure_csv_becomes_rows_with_times_after_the_first(tmp_path: Path) -> None:
    path = write(tmp_path, "mine.csv", AZURE)
    rows = list(read_trace(path))
    assert [(r.input_tokens, r.output_tokens, r.hash_ids) for r in rows] == [
        (374, 44, ()),
        (396, 0, ()),
        (12, 7, ()),
    ]
    assert rows[0].at_s == 0.0
    assert rows[1].at_s == pytest.approx(4.314579)
    assert rows[2].at_s == rows[1].at_s
    assert check_trace(path) == TraceInfo("azure", 3, rows[2].at_s)


def test_azure_timestamps_may_be_seconds(tmp_path: Path) -> None:
    path = write(tmp_path, "s.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n100.5,8,2\n102,9,3\n")
    assert list(read_trace(path)) == [TraceRow(0.0, 8, 2), TraceRow(1.5, 9, 3)]
    # As a spreadsheet saves it: a byte-order mark first, without a .csv name.
    (tmp_path / "excel.txt").write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert list(read_trace(tmp_path / "excel.txt")) == list(read_trace(path))


def test_a_mooncake_jsonl_becomes_rows_in_seconds_with_its_blocks(tmp_path: Path) -> None:
    path = write(tmp_path, "mine.jsonl", MOONCAKE)
    assert list(read_trace(path)) == [
        TraceRow(0.0, 600, 3, (7, 8)),
        TraceRow(0.25, 1100, 9, (7, 9)),
        TraceRow(1.0, 20, 1, ()),
    ]
    assert check_trace(path) == TraceInfo("mooncake", 3, 1.0)


def test_the_format_is_told_by_extension_else_by_the_first_line(tmp_path: Path) -> None:
    assert detect_format(tmp_path / "a.CSV") == "azure"  # by name alone: not opened
    assert detect_format(tmp_path / "a.jsonl") == "mooncake"
    assert detect_format(write(tmp_path, "a.txt", "\n" + MOONCAKE)) == "mooncake"
    assert detect_format(write(tmp_path, "b.log", AZURE)) == "azure"
    with pytest.raises(TraceError, match=r"c\.txt: cannot tell the trace's format"):
        detect_format(write(tmp_path, "c.txt", "when,in,out\n1,2,3\n"))


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("t.csv", AZURE.replace(",0,b", ",lots,b"), r"t\.csv:3: GeneratedTokens 'lots' is not"),
        ("t.csv", AZURE.replace(",a\r\n", "\r\n"), r"t\.csv:2: 3 fields where the header has 4"),
        ("t.csv", AZURE.replace("2023-11-16 18:15:50", "yesterday"), r"t\.csv:3: TIMESTAMP"),
        ("t.csv", AZURE.replace("12,7", "0,7"), r"t\.csv:5: ContextTokens is 0; it must be"),
        ("t.csv", AZURE.replace(":50.9951690,12", ":40,12"), r"t\.csv:5: .* earlier than"),
        ("t.csv", AZURE.replace("ContextTokens,", "Context,"), r"t\.csv:1: the header lacks"),
        ("t.csv", "", r"t\.csv: empty file"),
        ("t.jsonl", MOONCAKE.replace("5250", '"soon"'), r"t\.jsonl:2: Expected `float`, got `str`"),
        ("t.jsonl", MOONCAKE.replace('"output_length": 9, ', ""), r"t\.jsonl:2: .*output_len"),
        ("t.jsonl", MOONCAKE.replace("6000", "4000"), r"t\.jsonl:4: .* earlier than"),
        ("t.jsonl", MOONCAKE + "{oops\n", r"t\.jsonl:5: not a JSON object"),
        ("t.jsonl", MOONCAKE.replace("1100", "-1"), r"t\.jsonl:2: Expected `int` >= 1"),
    ],
)
def test_a_bad_row_is_an_error_naming_its_line(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError, match=message):
        check_trace(path)


def test_unreadable_files_are_errors_not_tracebacks(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"gone\.csv: cannot read it"):
        check_trace(tmp_path / "gone.csv")
    (tmp_path / "latin.csv").write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n1,\xe9,2\n")
    with pytest.raises(TraceError, match="not UTF-8"):
        check_trace(tmp_path / "latin.csv")
    with pytest.raises(TraceError, match="no requests"):
        check_trace(write(tmp_path, "header.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"))


def test_a_file_replays_with_exact_lengths_and_shared_blocks(tmp_path: Path) -> None:
    specs = list(trace_file(write(tmp_path, "mine.jsonl", MOONCAKE), random.Random(1)))
    assert [(s.at_s, s.prompt_tokens, s.max_tokens) for s in specs] == [
        (0.0, 600, 3),
        (0.25, 1100, 9),
        (1.0, 20, 1),
    ]
    for spec in specs:
        assert count_tokens(spec.prompt) == spec.prompt_tokens
    # Both start with block 7, then differ: one block of prompt in common.
    first = first_filler_tokens(specs[0].prompt, MOONCAKE_BLOCK_TOKENS)
    assert specs[1].prompt.startswith(first)
    assert specs[1].prompt[len(first) :][:40] != specs[0].prompt[len(first) :][:40]
    # Azure rows have no blocks: fresh prompts, and output never asked as 0 tokens.
    azure = list(trace_file(write(tmp_path, "mine.csv", AZURE), random.Random(1)))
    assert [s.max_tokens for s in azure] == [44, 1, 7]
