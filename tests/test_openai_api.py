"""Error bodies have OpenAI's shape exactly: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import json

import pytest

from fleetgate.openai_api import error_body, error_event, error_type


def test_the_body_has_exactly_the_four_fields() -> None:
    body = json.loads(error_body(400, "`model` is required.", "model", "missing_model"))
    assert body == {
        "error": {
            "message": "`model` is required.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "missing_model",
        }
    }


def test_absent_param_and_code_are_null_not_missing() -> None:
    body = json.loads(error_body(502, "the backend failed"))
    assert list(body) == ["error"]
    assert list(body["error"]) == ["message", "type", "param", "code"]
    assert body["error"]["param"] is None
    assert body["error"]["code"] is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "invalid_request_error"),
        (405, "invalid_request_error"),
        (408, "timeout_error"),
        (413, "invalid_request_error"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "server_error"),
        (502, "server_error"),
        (503, "server_error"),
        (504, "server_error"),
    ],
)
def test_the_type_follows_the_status(status: int, kind: str) -> None:
    assert error_type(status) == kind
    assert json.loads(error_body(status, "x"))["error"]["type"] == kind


def test_messages_are_escaped_as_json() -> None:
    message = 'quote " backslash \\ newline \n and ünïcode'
    assert json.loads(error_body(400, message))["error"]["message"] == message


def test_an_error_event_is_one_sse_event_with_the_same_body() -> None:
    event = error_event(503, "no backend is ready", "no_backend")
    assert event.startswith(b"data: ")
    assert event.endswith(b"\n\n")
    assert event.count(b"\n") == 2
    payload = json.loads(event.removeprefix(b"data: "))
    assert payload == {
        "error": {
            "message": "no backend is ready",
            "type": "server_error",
            "param": None,
            "code": "no_backend",
        }
    }


def test_usage_is_read_from_every_answer_that_counts_tokens() -> None:
    from fleetgate.openai_api import usage_of

    chat = usage_of(b'{"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}')
    assert chat is not None and (chat.prompt_tokens, chat.completion_tokens) == (5, 2)
    response = usage_of(b'{"usage":{"input_tokens":4,"output_tokens":3,"total_tokens":7}}')
    assert response is not None and (response.prompt_tokens, response.completion_tokens) == (4, 3)
    rerank = usage_of(b'{"results":[],"usage":{"total_tokens":12}}')
    assert rerank is not None and (rerank.prompt_tokens, rerank.completion_tokens) == (12, 0)
    # In seconds, or none at all: None, and what was reserved for the request stands.
    assert usage_of(b'{"text":"hi","usage":{"type":"duration","seconds":3}}') is None
    assert usage_of(b'{"text":"hi"}') is None
