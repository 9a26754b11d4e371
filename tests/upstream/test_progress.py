"""What a stream's progress records: the text, tool calls, logprobs, tokens, id and end of what
the client was sent, choice by choice."""

from __future__ import annotations

import msgspec

from fleetgate.upstream.progress import StreamProgress


def _event(content: str | None, finish: str | None = None, id_: str = "c-1") -> bytes:
    delta = {} if content is None else {"content": content}
    chunk = {"id": id_, "created": 7, "choices": [{"delta": delta, "finish_reason": finish}]}
    return b"data: " + msgspec.json.encode(chunk) + b"\n\n"


def _fed(*events: bytes) -> StreamProgress:
    progress = StreamProgress()
    for event in events:
        progress.feed(event)
    progress.settle()
    return progress


def test_a_stream_reported_in_a_few_events_counts_the_same_as_one_event_a_token() -> None:
    words = [" the", " world", " is", " large"] * 10
    one_a_token = _fed(*(_event(w) for w in words))
    few = _fed(*(_event("".join(words[i : i + 10])) for i in range(0, 40, 10)))
    assert (one_a_token.events, few.events) == (40, 4)
    assert one_a_token.tokens == few.tokens == 48  # 190 characters / 4: never the events
    usage = b'data: {"id":"c-1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":40}}'
    few.feed(usage + b"\n\n")
    few.settle()
    assert few.tokens == 40  # what the engine said, once it said it


def test_plain_events_give_text_tokens_id_and_the_end() -> None:
    progress = _fed(
        _event(""), _event("Hel"), _event("lo"), _event(None, "stop"), b"data: [DONE]\n\n"
    )
    # 5 characters of text: 2 tokens by the estimate; 2 deltas; 4 data events
    assert (progress.text, progress.tokens, progress.deltas, progress.events) == ("Hello", 2, 2, 4)
    assert (progress.id, progress.created) == ("c-1", 7)
    assert progress.finished and progress.done


def test_several_events_in_one_read_count_like_one_by_one() -> None:
    events = [_event(str(i)) for i in range(100)]
    assert _fed(b"".join(events)).deltas == _fed(*events).deltas == 100
    assert _fed(b"".join(events)).tokens == _fed(*events).tokens == 48  # 190 characters / 4
    assert _fed(b"".join(events)).events == _fed(*events).events == 100
    assert _fed(b"".join(events)).text == "".join(str(i) for i in range(100))


def test_crlf_comments_other_fields_and_a_bad_payload_are_read_around() -> None:
    progress = _fed(
        b": keep-alive\n\n",
        _event("a").replace(b"\n", b"\r\n"),
        b"event: note\ndata: {not json\n\n",
        _event("b"),
        b"data: [DONE]\r\n\r\n",
    )
    assert (progress.text, progress.deltas, progress.done) == ("ab", 2, True)
    assert progress.events == 3  # the comment is no data event, [DONE] is not counted


def test_a_completion_stream_counts_its_text() -> None:
    chunk = b'data: {"id":"cmpl-1","created":1,"choices":[{"text":"hi","finish_reason":null}]}\n\n'
    assert _fed(chunk, chunk).text == "hihi"


def test_the_first_id_is_kept_and_settling_twice_changes_nothing() -> None:
    progress = _fed(_event("a", id_="first"), _event("b", id_="second"))
    progress.settle()
    assert (progress.id, progress.deltas) == ("first", 2)
    assert not progress.finished and not progress.done


def _chunk(*choices: dict[str, object]) -> bytes:
    return (
        b"data: " + msgspec.json.encode({"id": "c-1", "created": 7, "choices": choices}) + b"\n\n"
    )


def _arguments(piece: str) -> dict[str, object]:
    return {"index": 0, "function": {"arguments": piece}}


def test_tool_calls_are_recorded_per_call_with_their_arguments_so_far() -> None:
    head = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": ""}}  # fmt: skip
    progress = _fed(
        _chunk({"index": 0, "delta": {"role": "assistant", "content": None}}),
        _chunk({"index": 0, "delta": {"tool_calls": [head]}}),
        _chunk({"index": 0, "delta": {"tool_calls": [_arguments('{"ci')]}}),
        _chunk({"index": 0, "delta": {"tool_calls": [_arguments('ty": "')]}}),
    )
    (choice,) = progress.choices.values()
    (call,) = choice.tool_calls.values()
    assert (call.id, call.type, call.name, "".join(call.arguments)) == (
        "call_1", "function", "get_weather", '{"city": "'
    )  # fmt: skip
    assert progress.tool_calls and progress.text == "" and progress.deltas == 2
    assert not progress.finished


def test_choices_are_kept_apart_with_their_logprobs_and_ends() -> None:
    entry = {"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}
    progress = _fed(
        _chunk({"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [entry]}}),
        _chunk({"index": 1, "delta": {"content": "b"}, "logprobs": {"content": [entry]}}),
        _chunk({"index": 0, "delta": {"content": "c"}, "logprobs": {"content": [entry, entry]}}),
        _chunk({"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": None}),
    )
    first, second = progress.choices[0], progress.choices[1]
    assert (first.text, first.logprobs, first.finish_reason) == ("ac", 3, "stop")
    assert (second.text, second.logprobs, second.finish_reason) == ("b", 1, None)
    assert progress.text == "ac" and progress.deltas == 3 and progress.tokens == 1
    assert not progress.finished  # choice 1 has not ended
    progress.feed(_chunk({"index": 1, "delta": {}, "finish_reason": "length"}))
    progress.settle()
    assert progress.finished and progress.reported is None
    progress.feed(b'data: {"id":"c-1","choices":[],"usage":{"completion_tokens":4}}\n\n')
    progress.settle()
    assert progress.reported is not None and progress.tokens == 4  # the engine's own count


def test_completions_logprobs_count_their_tokens() -> None:
    legacy = {"tokens": ["x", "y"], "token_logprobs": [-1.0, -2.0],
              "top_logprobs": [{}, {}], "text_offset": [0, 1]}  # fmt: skip
    progress = _fed(_chunk({"index": 0, "text": "xy", "logprobs": legacy}))
    assert (progress.choices[0].logprobs, progress.text) == (2, "xy")
