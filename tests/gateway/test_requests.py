"""Parsing OpenAI bodies: what routing needs comes out; a bad body is a 400 `Refused` that names the
field (`param`) and says what to send instead."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fleetgate.gateway.requests import (
    MAX_DEPTH,
    parse_chat,
    parse_completion,
    parse_embedding,
)
from fleetgate.routing.base import RoutingRequest
from fleetgate.traffic.door import Refused

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
    with pytest.raises(Refused) as info:
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
    with pytest.raises(Refused) as info:
        parse(body, {})
    assert info.value.param is None
    assert info.value.status == 400
    assert info.value.message.startswith(says)
    assert fields in info.value.message


def chat_with(content: bytes, model: bytes = b"m") -> bytes:
    return b'{"model": "%b", "messages": [{"role": "user", "content": %b}]}' % (model, content)


@pytest.mark.parametrize(
    "body",
    [
        chat_with(b'"caf\xc3"'),  # cut off mid-character, inside a message kept as raw bytes
        chat_with(b'"\xff\xfe"'),
        chat_with(b'"x"', model=b"m\xff"),  # in a field the gateway decodes
        chat_with(b'"x"') + b" \xed\xa0\x80",  # an encoded surrogate, outside any value
    ],
)
def test_a_body_that_is_not_utf8_is_refused_with_where(body: bytes) -> None:
    with pytest.raises(Refused) as info:
        parse_chat(body, {})
    assert info.value.status == 400
    assert "not valid UTF-8" in info.value.message
    assert f"offset {body.index(next(b for b in body if b >= 0x80).to_bytes())}" in (
        info.value.message
    )


def test_non_ascii_utf8_is_fine() -> None:
    body = chat_with('"häagen-dazs 東京 🚀"'.encode())
    assert parse_chat(body, {}).prompt.startswith(b'{"role"')


def nested(depth: int) -> bytes:
    """A message whose content nests `depth - 3` levels deep (the body adds three: the body,
    `messages` and the message), with objects and arrays alternating."""
    inner = b"1"
    for level in range(depth - 3):
        inner = b'{"a": %b}' % inner if level % 2 else b"[%b]" % inner
    return chat_with(inner)


def test_nesting_up_to_the_limit_passes_and_one_more_level_is_refused() -> None:
    parse_chat(nested(MAX_DEPTH), {})
    with pytest.raises(Refused) as info:
        parse_chat(nested(MAX_DEPTH + 1), {})
    assert info.value.status == 400
    assert f"more than {MAX_DEPTH} levels" in info.value.message


def test_a_thousand_levels_in_a_2_kb_body_is_a_400_not_a_recursion_error() -> None:
    body = chat_with(b"[" * 1000 + b"]" * 1000)
    with pytest.raises(Refused, match="levels deep"):
        parse_chat(body, {})


@pytest.mark.parametrize(
    "content",
    [
        b'"' + b"[{" * 200 + b'"',  # brackets inside a string are text, not nesting
        b'"\\"' + b"[" * 200 + b'\\""',  # ...also after an escaped quote
        b'["\\\\", "' + b"[" * 200 + b'"]',  # an escaped backslash escapes no quote
    ],
)
def test_brackets_inside_strings_do_not_count(content: bytes) -> None:
    parse_chat(b'{"model": "m", "messages": [{"content": %b}]}' % content, {})


def test_many_messages_at_low_depth_pass() -> None:
    body = b'{"model": "m", "messages": [%b]}' % b", ".join(
        [b'{"role": "user", "content": [{"type": "text", "text": "[{"}]}'] * 500
    )
    assert len(parse_chat(body, {}).prompt) > 500


def test_an_unexpected_error_while_decoding_is_still_a_400(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Broken:
        def decode(self, body: bytes) -> object:
            raise MemoryError  # any error the decoder was not expected to raise

    monkeypatch.setattr("fleetgate.gateway.requests._chat", Broken())
    with pytest.raises(Refused) as info:
        parse_chat(chat_with(b'"x"'), {})
    assert info.value.status == 400
    assert "could not be read" in info.value.message


def test_a_form_s_model_field_is_found_and_a_file_named_model_is_not_it() -> None:
    from fleetgate.gateway.requests import multipart_field

    ctype = b'multipart/form-data; boundary="XyZ"'
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="model"\r\n\r\n'
        b'RIFF\r\n--XyZ\r\ncontent-disposition: form-data; name="model"\r\n\r\n'
        b"whisper-1\r\n--XyZ--\r\n"
    )
    assert multipart_field(body, ctype, b"model") == b"whisper-1"
    only_file = body.split(b"--XyZ\r\ncontent-disposition")[0] + b"--XyZ--\r\n"
    assert multipart_field(only_file, ctype, b"model") is None
    assert multipart_field(body, b"application/json", b"model") is None
    assert multipart_field(body, b"multipart/form-data; boundary=" + b"x" * 71, b"model") is None


def test_a_form_naming_its_model_twice_is_refused_and_a_delimiter_inside_a_line_is_content() -> (
    None
):
    from fleetgate.gateway.requests import multipart_field

    ctype = b"multipart/form-data; boundary=B"
    model = b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\n%b\r\n'
    twice = model % b"a" + model % b"b" + b"--B--\r\n"
    with pytest.raises(Refused, match="`model` twice"):
        multipart_field(twice, ctype, b"model")
    # A file whose bytes hold "--B" and a fake part mid-line: not a part the engine sees.
    hidden = (
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        b'RIFF x--B\r\nContent-Disposition: form-data; name="model"\r\n\r\nevil\r\n'
        + model % b"whisper-1"
        + b"--B--\r\n"
    )
    assert multipart_field(hidden, ctype, b"model") == b"whisper-1"
