"""The `limit` + `after` pagination that both list endpoints (files, batches) share."""

from __future__ import annotations

from fleetgate.batches.pages import page

IDS = ["a", "b", "c", "d", "e"]


def _page(limit: int, after: str | None) -> tuple[list[str], bool]:
    return page(IDS, lambda i: i, limit, after)


def test_a_page_starts_after_the_cursor_and_says_whether_more_follow() -> None:
    assert _page(2, None) == (["a", "b"], True)
    assert _page(2, "b") == (["c", "d"], True)
    assert _page(2, "c") == (["d", "e"], False)
    assert _page(10, "e") == ([], False)


def test_a_cursor_that_names_no_item_gives_an_empty_page() -> None:
    assert _page(10, "gone") == ([], False)
