"""A file of backends: read when it changes, and what it refuses (a broken or half-written file
is an error, so the last good set stays; `backends: []` is an answer)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fleetgate.discovery.file_source import MAX_BYTES, FileSource
from fleetgate.discovery.found import Found, SourceError


def replace(path: Path, text: str) -> None:
    """As a careful writer does: a new file renamed over the old one."""
    new = path.with_suffix(".new")
    new.write_text(text)
    os.replace(new, path)


async def test_it_reads_yaml_or_json_and_again_only_when_the_file_changed(tmp_path: Path) -> None:
    path = tmp_path / "backends.yaml"
    replace(path, "backends:\n  - {model: m, url: 'http://10.0.0.5:8000', labels: {zone: a}}\n")
    source = FileSource(path, 1.0)
    assert source.name == f"file:{path}"
    first = await source.read()
    assert first == [Found(model="m", url="http://10.0.0.5:8000", labels={"zone": "a"})]
    assert await source.read() is first  # unchanged: not parsed again
    replace(path, '{"backends": [{"model": "m", "url": "http://10.0.0.6:8000", "ready": false}]}')
    assert await source.read() == [Found(model="m", url="http://10.0.0.6:8000", ready=False)]
    replace(path, "backends: []\n")
    assert await source.read() == []


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "is empty (write a new file and rename it over the old)"),
        ("backends: [", "is not valid YAML"),
        ("backends:\n  - {model: m}\n", "missing required field `url`"),
        ("backends:\n  - {model: m, url: 'ftp://x'}\n", "`url` must be http(s)://HOST:PORT"),
        ("backends:\n  - {model: m, url: 'http://x:80', weight: 0}\n", "`weight` must be"),
        ("backends:\n  - {model: m, url: 'http://x:80', engine: rocket}\n", "`engine`: 'rocket'"),
        ("backends:\n  - {model: m, url: 'http://x:80', secret: 1}\n", "unknown field `secret`"),
        ("hosts: []\n", "unknown field `hosts`"),
        ("[1, 2]\n", "Expected `object`, got `array`"),
    ],
)
async def test_a_file_it_cannot_use_is_an_error_naming_what_is_wrong(
    tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "backends.yaml"
    replace(path, text)
    with pytest.raises(SourceError, match=re.escape(says)):
        await FileSource(path, 1.0).read()


async def test_a_missing_or_oversized_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "backends.yaml"
    with pytest.raises(SourceError, match="cannot read"):
        await FileSource(path, 1.0).read()
    replace(path, "#" * (MAX_BYTES + 1))
    with pytest.raises(SourceError, match="is over"):
        await FileSource(path, 1.0).read()


async def test_a_broken_file_is_read_again_once_it_is_fixed(tmp_path: Path) -> None:
    path = tmp_path / "backends.yaml"
    replace(path, "backends: [")
    source = FileSource(path, 1.0)
    with pytest.raises(SourceError):
        await source.read()
    replace(path, "backends: [{model: m, url: 'http://x:80'}]")
    assert [f.url for f in await source.read()] == ["http://x:80"]
