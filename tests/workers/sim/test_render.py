"""Answers beyond the plain one, through the official openai SDK against a real sim worker:
n choices, stop sequences, logprobs, echo and several prompts, tool calls, JSON output."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import openai

USER = [{"role": "user", "content": "hello there"}]


async def test_n_choices_whole_and_streamed_are_the_same_and_usage_counts_them_all(
    sdk: openai.AsyncOpenAI,
) -> None:
    whole = await sdk.chat.completions.create(model="m", messages=USER, n=3, max_tokens=5, seed=1)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    texts = [c.message.content for c in whole.choices]
    assert len(set(texts)) == 3 and all(len(str(t).split()) == 5 for t in texts)
    assert whole.usage is not None and whole.usage.completion_tokens == 15
    single = await sdk.chat.completions.create(model="m", messages=USER, max_tokens=5, seed=1)
    assert single.choices[0].message.content == texts[0]  # choice 0 is the n=1 answer
    assert whole.usage.prompt_tokens == single.usage.prompt_tokens

    stream = await sdk.chat.completions.create(
        model="m", messages=USER, n=3, max_tokens=5, seed=1, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    parts: dict[int, str] = defaultdict(str)
    reasons, usage = {}, None
    async for chunk in stream:
        for c in chunk.choices:
            parts[c.index] += c.delta.content or ""
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
        usage = chunk.usage or usage
    assert [parts[i] for i in range(3)] == texts
    assert reasons == {0: "length", 1: "length", 2: "length"}
    assert usage is not None and usage.completion_tokens == 15


async def test_a_stop_sequence_ends_the_answer_before_it_streamed_or_not(
    sdk: openai.AsyncOpenAI,
) -> None:
    ask: dict[str, Any] = {"model": "m", "messages": USER, "max_tokens": 30, "seed": 4}
    uncut = str((await sdk.chat.completions.create(**ask)).choices[0].message.content)
    words = uncut.split(" ")
    stop = " " + words[10] + " " + words[11]  # two tokens
    expected = uncut[: uncut.index(stop)]
    cut = await sdk.chat.completions.create(**ask, stop=[stop, "never seen"])
    assert cut.choices[0].message.content == expected
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage is not None and cut.usage.completion_tokens < 30
    stream = await sdk.chat.completions.create(**ask, stop=stop, stream=True)
    pieces, reason = [], None
    async for chunk in stream:
        pieces.append(chunk.choices[0].delta.content or "")
        reason = chunk.choices[0].finish_reason or reason
    assert "".join(pieces) == expected and reason == "stop"
    text = await sdk.completions.create(model="m", prompt="hi", max_tokens=30, seed=4, stop=stop)
    assert text.choices[0].text == expected


async def test_chat_logprobs_list_each_token_with_its_top_ones_first_the_chosen(
    sdk: openai.AsyncOpenAI,
) -> None:
    ask: dict[str, Any] = {"model": "m", "messages": USER, "max_tokens": 6, "seed": 2,
                           "logprobs": True, "top_logprobs": 3}  # fmt: skip
    reply = (await sdk.chat.completions.create(**ask)).choices[0]
    assert reply.logprobs is not None and reply.logprobs.content is not None
    entries = reply.logprobs.content
    assert "".join(e.token for e in entries) == reply.message.content
    for e in entries:
        assert e.logprob < 0 and e.bytes == list(e.token.encode())
        assert e.top_logprobs[0].token == e.token and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob == e.logprob
    stream = await sdk.chat.completions.create(**ask, stream=True)
    streamed = []
    async for chunk in stream:
        choice = chunk.choices[0]
        if choice.delta.content:
            assert choice.logprobs is not None and choice.logprobs.content is not None
            (entry,) = choice.logprobs.content
            assert entry.token == choice.delta.content
            streamed.append(entry)
    assert streamed == entries


async def test_completion_logprobs_in_the_legacy_form_with_echo(sdk: openai.AsyncOpenAI) -> None:
    reply = await sdk.completions.create(
        model="m", prompt="say it", max_tokens=4, seed=3, logprobs=2, echo=True
    )
    choice = reply.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert lp.text_offset is not None
    assert choice.text.startswith("say it") and "".join(lp.tokens) == choice.text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the prompt's first
    for token, chosen, top in zip(
        lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True
    ):
        assert chosen is not None and chosen < 0
        assert top is not None and len(top) == 2 and next(iter(top)) == token


async def test_several_prompts_get_n_choices_each_in_order(sdk: openai.AsyncOpenAI) -> None:
    reply = await sdk.completions.create(
        model="m", prompt=["one two", "three four five"], n=2, max_tokens=3, echo=True
    )
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert [c.text.split(" ")[0] for c in reply.choices] == ["one", "one", "three", "three"]
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 12 and reply.usage.prompt_tokens == 2 + 3


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}}}  # fmt: skip


async def test_a_tool_call_whole_and_streamed_as_openai_streams_it(
    sdk: openai.AsyncOpenAI,
) -> None:
    ask: dict[str, Any] = {"model": "m", "messages": USER, "seed": 8, "tools": [WEATHER],
                           "tool_choice": "required"}  # fmt: skip
    reply = (await sdk.chat.completions.create(**ask)).choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.content is None
    (call,) = reply.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments["city"], str) and isinstance(arguments["days"], int)

    stream = await sdk.chat.completions.create(**ask, stream=True)
    deltas, reason = [], None
    async for chunk in stream:
        deltas.extend(chunk.choices[0].delta.tool_calls or [])
        reason = chunk.choices[0].finish_reason or reason
    head, *fragments = deltas
    assert (head.index, head.id, head.type) == (0, call.id, "function")
    assert head.function is not None and head.function.name == "get_weather"
    assert head.function.arguments == "" and len(fragments) > 3
    assert "".join(f.function.arguments or "" for f in fragments if f.function) == (
        call.function.arguments
    )
    assert reason == "tool_calls"
    # "auto" calls only when the last user message names the tool.
    plain = await sdk.chat.completions.create(**{**ask, "tool_choice": "auto"})
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content
    asked = [{"role": "user", "content": "use get_weather please"}]
    named = await sdk.chat.completions.create(**{**ask, "tool_choice": "auto", "messages": asked})
    assert named.choices[0].finish_reason == "tool_calls"


async def test_json_output_follows_the_schema_whole_and_streamed(sdk: openai.AsyncOpenAI) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"},
              "sizes": {"type": "array", "items": {"enum": ["S", "M", "L"]}}}}  # fmt: skip
    fmt = {"type": "json_schema", "json_schema": {"name": "shirt", "schema": schema}}
    ask: dict[str, Any] = {"model": "m", "messages": USER, "seed": 9, "response_format": fmt}
    reply = (await sdk.chat.completions.create(**ask)).choices[0]
    value = json.loads(str(reply.message.content))
    assert isinstance(value["name"], str) and value["sizes"][0] in ("S", "M", "L")
    assert reply.finish_reason == "stop"
    stream = await sdk.chat.completions.create(**ask, stream=True)
    pieces = [c.choices[0].delta.content async for c in stream if c.choices[0].delta.content]
    assert len(pieces) > 5 and "".join(pieces) == reply.message.content
    anything = await sdk.chat.completions.create(
        model="m", messages=USER, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(str(anything.choices[0].message.content)), dict)
