"""Request traces read a line at a time: the Azure LLM inference CSV and Mooncake's JSONL.

Both formats become the same `TraceRow`s, times in seconds after the file's first request, so
one replay (`traces.replay`) serves the shipped traces and a user's own file. A row that cannot
be read raises `TraceError` naming the file, the line and what is wrong with it.

Azure (`.csv`): a header naming TIMESTAMP, ContextTokens and GeneratedTokens (other columns are
ignored), then one request a row; TIMESTAMP is a date and time (2023-11-16 18:15:46.6805900)
or a number of seconds. Mooncake (`.jsonl`): one JSON object a line, {"timestamp": ms,
"input_length": n, "output_length": n, "hash_ids": [...]}; each hash id names a 512-token
block of prompt, so rows that share ids share prompt prefixes (hash_ids may be left out).
Rows must be in time order: a replay sends them in file order.
"""

from __future__ import annotations

import contextlib
import csv
import math
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

import msgspec

TraceFormat = Literal["azure", "mooncake"]
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_SUFFIXES: dict[str, TraceFormat] = {".csv": "azure", ".jsonl": "mooncake", ".json": "mooncake"}


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace."""

    at_s: float  # seconds after the trace's first request
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()  # prompt blocks (Mooncake); () when the trace has none


@dataclass(frozen=True, slots=True)
class TraceInfo:
    """What a whole trace file holds, from `check_trace`."""

    format: TraceFormat
    requests: int
    span_s: float  # from the first request to the last


def detect_format(path: Path) -> TraceFormat:
    """The file's format: by its extension, else by its first non-blank line."""
    by_suffix = _SUFFIXES.get(path.suffix.lower())
    if by_suffix is not None:
        return by_suffix
    with contextlib.closing(_lines(path)) as lines:
        first = next((line.strip() for line in lines if line.strip()), "")
    if first.startswith("{"):
        return "mooncake"
    if first.startswith("TIMESTAMP"):
        return "azure"
    raise TraceError(
        f"{path}: cannot tell the trace's format: neither a .csv or .jsonl name, nor a first "
        "line that starts an Azure CSV (TIMESTAMP,...) or a Mooncake JSON object ({...)"
    )


def read_trace(path: Path, fmt: TraceFormat | None = None) -> Iterator[TraceRow]:
    """The file's rows, lazily; `fmt` None: detect it."""
    fmt = fmt or detect_format(path)
    read = azure_rows if fmt == "azure" else mooncake_rows
    return read(_lines(path), str(path))


def check_trace(path: Path) -> TraceInfo:
    """Read the whole file once, keeping nothing, so a bad row is found before a run starts."""
    fmt = detect_format(path)
    count, last = 0, 0.0
    for row in read_trace(path, fmt):
        count += 1
        last = row.at_s
    if count == 0:
        raise TraceError(f"{path}: the trace has no requests")
    return TraceInfo(fmt, count, last)


def azure_rows(lines: Iterable[str], name: str) -> Iterator[TraceRow]:
    """Rows of an Azure LLM inference trace CSV; `name` is the file, for errors."""
    rows = csv.reader(lines)
    header = next(rows, None)
    if header is None:
        raise TraceError(f"{name}: empty file; an Azure trace starts with a header line")
    missing = [column for column in AZURE_COLUMNS if column not in header]
    if missing:
        raise TraceError(
            f"{name}:{rows.line_num}: the header lacks {', '.join(missing)}; an Azure trace's "
            f"header is {','.join(AZURE_COLUMNS)}"
        )
    at, context, generated = (header.index(column) for column in AZURE_COLUMNS)
    origin: datetime | float | None = None
    previous = 0.0
    for fields in rows:
        if not fields:
            continue
        where = f"{name}:{rows.line_num}"
        if len(fields) != len(header):
            raise TraceError(f"{where}: {len(fields)} fields where the header has {len(header)}")
        when = _timestamp(fields[at].strip(), where)
        origin = when if origin is None else origin
        if isinstance(when, datetime) and isinstance(origin, datetime):
            at_s = (when - origin).total_seconds()
        elif isinstance(when, float) and isinstance(origin, float):
            at_s = when - origin
        else:
            raise TraceError(f"{where}: TIMESTAMP mixes numbers of seconds and dates")
        previous = _in_order(at_s, previous, where)
        yield TraceRow(
            at_s,
            _tokens(fields[context], "ContextTokens", 1, where),
            _tokens(fields[generated], "GeneratedTokens", 0, where),
        )


def _timestamp(text: str, where: str) -> datetime | float:
    """A date and time (naive ones taken as UTC, so all can be subtracted), or seconds."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds):
            return seconds
    try:
        # Seven fractional digits, as Azure writes them: fromisoformat (3.11+) keeps six.
        when = datetime.fromisoformat(text)
    except ValueError:
        raise TraceError(
            f"{where}: TIMESTAMP {text!r} is neither a date and time "
            "(2023-11-16 18:15:46.68) nor a number of seconds"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _tokens(text: str, column: str, least: int, where: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise TraceError(f"{where}: {column} {text!r} is not a whole number of tokens") from None
    if n < least:
        raise TraceError(f"{where}: {column} is {n}; it must be at least {least}")
    return n


def _in_order(at_s: float, previous_s: float, where: str) -> float:
    if at_s < previous_s:
        raise TraceError(
            f"{where}: this request is {previous_s - at_s:.3f} s earlier than the one before; "
            "a replay sends rows in file order, so sort the file by time"
        )
    return at_s


class _MooncakeRow(msgspec.Struct):
    timestamp: Annotated[float, msgspec.Meta(ge=0)]  # ms
    input_length: Annotated[int, msgspec.Meta(ge=1)]
    output_length: Annotated[int, msgspec.Meta(ge=0)]
    hash_ids: list[int] = msgspec.field(default_factory=list)


_MOONCAKE = msgspec.json.Decoder(_MooncakeRow)


def mooncake_rows(lines: Iterable[str], name: str) -> Iterator[TraceRow]:
    """Rows of a Mooncake trace (JSON lines); `name` is the file, for errors."""
    origin: float | None = None
    previous = 0.0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        try:
            row = _MOONCAKE.decode(line)
        except msgspec.ValidationError as exc:
            raise TraceError(f"{where}: {exc}") from None
        except msgspec.DecodeError as exc:
            raise TraceError(f"{where}: not a JSON object ({exc})") from None
        origin = row.timestamp if origin is None else origin
        previous = _in_order((row.timestamp - origin) / 1000.0, previous, where)
        yield TraceRow(previous, row.input_length, row.output_length, tuple(row.hash_ids))


def _lines(path: Path) -> Generator[str, None, None]:
    """The file's lines, its I/O and decoding errors as TraceErrors."""
    try:
        # utf-8-sig: spreadsheets start their CSVs with a byte-order mark, which is no column.
        with path.open("r", encoding="utf-8-sig", newline="") as f:
            yield from f
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read it ({exc.strerror or exc})") from None
