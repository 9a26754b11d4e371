"""A batch's input file checked line by line: each fault named by its line and code."""

from __future__ import annotations

import json

import pytest

from fleetgate.batches.validation import MAX_ERRORS, check_input

CHAT = "/v1/chat/completions"


def _line(custom_id: object = "a", **changes: object) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    line: dict[str, object] = {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}
    line.update(changes)
    return json.dumps(line).encode()


def test_a_good_file_gives_its_requests_in_order_with_their_bodies_as_sent() -> None:
    data = b"\n".join([_line("a"), b"", _line("b")]) + b"\n"
    checked = check_input(data, CHAT, 10)
    assert not checked.errors
    assert [(r.custom_id, r.line) for r in checked.requests] == [("a", 1), ("b", 3)]
    assert json.loads(checked.requests[0].body)["messages"][0]["content"] == "x"
    assert checked.model == "m"


@pytest.mark.parametrize(
    ("bad", "code", "param"),
    [
        (b"{not json", "invalid_json_line", None),
        (b"[1, 2]", "invalid_request", None),
        (json.dumps({"method": "POST", "url": CHAT, "body": {"model": "m"}}).encode(),
         "missing_required_parameter", "custom_id"),
        (_line("a"), "duplicate_custom_id", "custom_id"),
        (_line("b", method="GET"), "invalid_method", "method"),
        (_line("b", url="/v1/embeddings"), "invalid_url", "url"),
        (_line("b", body={"messages": []}), "invalid_body", "body"),
        (_line("b", body="text"), "invalid_body", "body"),
        (_line(""), "invalid_custom_id", "custom_id"),
        (_line(7), "invalid_request", "custom_id"),
    ],
)  # fmt: skip
def test_each_fault_is_listed_with_its_line(bad: bytes, code: str, param: str | None) -> None:
    checked = check_input(_line("a") + b"\n" + bad + b"\n", CHAT, 10)
    assert len(checked.errors) == 1
    error = checked.errors[0]
    assert (error.code, error.line, error.param) == (code, 2, param)
    assert "2" in error.message


def test_a_streaming_body_is_run_whole() -> None:
    line = _line("a", body={"model": "m", "messages": [], "stream": True,
                            "stream_options": {"include_usage": True}})  # fmt: skip
    body = json.loads(check_input(line, CHAT, 10).requests[0].body)
    assert body["stream"] is False and "stream_options" not in body


def test_more_lines_than_allowed_fail_the_file_and_reading_stops() -> None:
    data = b"\n".join(_line(str(i)) for i in range(5))
    errors = check_input(data, CHAT, 3).errors
    assert [e.code for e in errors] == ["too_many_requests"]
    assert "batches.max_requests" in errors[0].message


def test_errors_listed_are_bounded() -> None:
    data = b"\n".join(b"{" for _ in range(MAX_ERRORS + 50))
    assert len(check_input(data, CHAT, 10_000).errors) == MAX_ERRORS


def test_bytes_that_are_not_utf8_name_their_line() -> None:
    errors = check_input(_line("a") + b"\n\xff\xfe\n", CHAT, 10).errors
    assert [(e.code, e.line) for e in errors] == [("invalid_json_line", 2)]


def test_an_empty_file_is_an_error() -> None:
    assert [e.code for e in check_input(b"\n \n", CHAT, 10).errors] == ["empty_file"]
