"""OpenAI's list pagination: at most `limit` items, from the one after the `after` cursor."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def page(
    items: Sequence[T], id_of: Callable[[T], str], limit: int, after: str | None
) -> tuple[list[T], bool]:
    """The first `limit` of `items` after the one whose id is `after` (from the first when
    `after` is None; none when no item has that id), and whether more follow."""
    if after is not None:
        ids = [id_of(item) for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    return list(items[:limit]), len(items) > limit
