"""Request bodies and stream chunks in the OpenAI format."""

from __future__ import annotations

import json

import msgspec
import pytest

from fleetgate.bench.payload import PATHS, encode_request, parse_chunk
from fleetgate.bench.workloads import Message, RequestSpec


def spec(endpoint: str) -> RequestSpec:
    messages = (Message("system", " a b"), Message("user", " c"))
    return RequestSpec(0.0, messages, 3, 16, "chat" if endpoint == "chat" else "completions")


def test_chat_body_streams_with_usage_and_ignores_eos() -> None:
    body = json.loads(encode_request(spec("chat"), model="m", stream=True))
    assert body == {
        "model": "m",
        "messages": [{"role": "system", "content": " a b"}, {"role": "user", "content": " c"}],
        "max_tokens": 16,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert PATHS["chat"] == b"/v1/chat/completions"


def test_completions_body_sends_the_joined_prompt_without_stream_options() -> None:
    body = json.loads(encode_request(spec("completions"), model="m", stream=False))
    assert body["prompt"] == " a b c"
    assert body["stream"] is False
    assert "stream_options" not in body
    assert PATHS["completions"] == b"/v1/completions"


def test_parse_chunk_reads_text_usage_and_errors() -> None:
    chat = parse_chunk(b'{"id":"x","choices":[{"index":0,"delta":{"content":" the"}}]}')
    assert (chat.text, chat.completion_tokens, chat.error) == (" the", None, None)
    role_only = parse_chunk(b'{"choices":[{"delta":{"role":"assistant"}}]}')
    assert role_only.text == ""
    reasoning = parse_chunk(b'{"choices":[{"delta":{"content":null,"reasoning_content":" hm"}}]}')
    assert reasoning.text == " hm"
    completion = parse_chunk(b'{"choices":[{"text":" of","finish_reason":null}]}')
    assert completion.text == " of"
    usage = parse_chunk(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}')
    assert (usage.text, usage.completion_tokens) == ("", 7)
    whole = parse_chunk(b'{"choices":[{"message":{"role":"assistant","content":" a b"}}]}')
    assert whole.text == " a b"
    error = parse_chunk(b'{"error":{"message":"overloaded","type":"server_error"}}')
    assert error.error == "overloaded"
    with pytest.raises(msgspec.DecodeError):
        parse_chunk(b"{not json")
