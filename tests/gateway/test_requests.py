"""Parsing OpenAI bodies: what routing needs comes out; a bad body is a BadRequest that names the
field (`param`) and says what to send instead."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fleetgate.gateway.requests import BadRequest, parse_chat, parse_completion, parse_embedding
from fleetgate.routing.base import RoutingRequest

Parse = Callable[[bytes, dict[bytes, bytes]], RoutingRequest]


def test_a_chat_body_gives_what_routing_needs() -> None:
    body = b"""{"model": "llama", "messages": [{"role": "user", "content": "hi"}],
        "stream": true, "max_tokens": 64, "user": "u1", "temperature": 0.2, "tools": []}"""
    request = parse_chat(body, {})
    assert (request.model, request.endpoint, request.stream) == ("llama", "chat", True)
    assert (request.max_tokens, request.session_key) == (64, "u1")


def test_chat_prefers_max_completion_tokens_and_the_session_header() -> None:
    body = b'{"model": "m", "messages": [{}], "max_tokens": 64, "max_completion_tokens": 9,'
    body += b' "user": "u1"}'
    request = parse_chat(body, {b"x-session-id": b"s-42"})
    assert (request.max_tokens, request.session_key) == (9, "s-42")


def test_chat_defaults() -> None:
    request = parse_chat(b'{"model": "m", "messages": [{"role": "user"}], "stream": null}', {})
    assert (request.stream, request.max_tokens, request.session_key) == (False, None, None)


def test_a_completion_body() -> None:
    body = b'{"model": "m", "prompt": ["a", "b"], "stream": false, "max_tokens": 5, "user": "u"}'
    request = parse_completion(body, {})
    assert (request.model, request.endpoint, request.stream) == ("m", "completions", False)
    assert (request.max_tokens, request.session_key) == (5, "u")
    assert parse_completion(b'{"model": "m", "prompt": "once upon"}', {}).model == "m"


def test_a_completion_takes_its_session_from_the_header_like_chat() -> None:
    body = b'{"model": "m", "prompt": "p", "user": "u"}'
    assert parse_completion(body, {b"x-session-id": b"s-1"}).session_key == "s-1"


def test_an_embedding_body() -> None:
    request = parse_embedding(b'{"model": "e", "input": ["a"], "user": "u"}', {})
    assert (request.model, request.endpoint, request.stream) == ("e", "embeddings", False)
    assert (request.max_tokens, request.session_key) == (None, "u")
    assert parse_embedding(b'{"model": "e", "input": "text"}', {}).model == "e"


@pytest.mark.parametrize(
    ("parse", "body", "param", "says"),
    [
        # A required field missing: name it and list what a body needs.
        (parse_chat, b'{"model": "m"}', "messages", "send a body with `model` and `messages`"),
        (parse_chat, b'{"messages": [{}]}', "model", "send a body with `model` and `messages`"),
        (parse_completion, b'{"prompt": "p"}', "model", "send a body with `model` and `prompt`"),
        (parse_embedding, b'{"input": "x"}', "model", "send a body with `model` and `input`"),
        # Present but empty or absent where routing needs it.
        (parse_chat, b'{"model": "m", "messages": []}', "messages", "non-empty array"),
        (parse_completion, b'{"model": "m"}', "prompt", "send a string or an array of strings"),
        (parse_embedding, b'{"model": "m"}', "input", "send a string or a non-empty array"),
        (parse_embedding, b'{"model": "m", "input": []}', "input", "a non-empty array"),
        # A wrong type: name the field and the type it must have.
        (parse_chat, b'{"model": 5, "messages": [{}]}', "model", "expected `str`, got `int`"),
        (parse_chat, b'{"model": "m", "messages": {}}', "messages", "expected `array`"),
        (parse_chat, b'{"model": "m", "messages": [{}], "stream": "yes"}', "stream", "`bool"),
        (
            parse_chat,
            b'{"model": "m", "messages": [{}], "max_tokens": 1.5}',
            "max_tokens",
            "expected `int | null`, got `float`",
        ),
        (
            parse_chat,
            b'{"model": "m", "messages": [{}], "max_completion_tokens": "9"}',
            "max_completion_tokens",
            "expected `int | null`, got `str`",
        ),
        (parse_chat, b'{"model": "m", "messages": [{}], "user": 7}', "user", "`str | null`"),
        (parse_completion, b'{"model": "m", "prompt": 5}', "prompt", "`str | array | null`"),
        (parse_embedding, b'{"model": "m", "input": {}}', "input", "`str | array | null`"),
    ],
)
def test_a_bad_field_names_the_param_and_what_to_send(
    parse: Parse, body: bytes, param: str, says: str
) -> None:
    with pytest.raises(BadRequest) as info:
        parse(body, {})
    assert info.value.param == param
    assert info.value.status == 400
    assert says in info.value.message
    assert f"`{param}`" in info.value.message
    assert str(info.value) == info.value.message


@pytest.mark.parametrize(
    ("parse", "fields"),
    [
        (parse_chat, "`model` and `messages`"),
        (parse_completion, "`model` and `prompt`"),
        (parse_embedding, "`model` and `input`"),
    ],
)
@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "The body is not valid JSON"),
        (b'{"model": "m",', "The body is not valid JSON"),
        (b"model=m", "The body is not valid JSON"),
        (b"[1, 2]", "The body must be a JSON object"),
        (b"null", "The body must be a JSON object"),
        (b'"text"', "The body must be a JSON object"),
    ],
)
def test_a_body_that_is_not_a_json_object_says_to_send_one(
    parse: Parse, fields: str, body: bytes, says: str
) -> None:
    with pytest.raises(BadRequest) as info:
        parse(body, {})
    assert info.value.param is None
    assert info.value.status == 400
    assert info.value.message.startswith(says)
    assert fields in info.value.message
