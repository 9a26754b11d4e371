"""What the sim worker refuses: every bad value a 400 in OpenAI's shape naming the parameter;
and what it continues: an assistant message picked up where it stopped."""

from __future__ import annotations

import json

import pytest

from fleetgate.resilience.continuation import continuation_body
from fleetgate.upstream.progress import StreamProgress
from tests.workers.sim.conftest import Worker

USER = [{"role": "user", "content": "hello"}]
CHAT = {"model": "m", "messages": USER, "max_tokens": 4}
TEXT = {"model": "m", "prompt": "hello", "max_tokens": 4}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (b"/v1/chat/completions", {**CHAT, "n": 0}, "n"),
        (b"/v1/completions", {**TEXT, "n": 129}, "n"),
        (b"/v1/chat/completions", {**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        (b"/v1/chat/completions", {**CHAT, "stop": [""]}, "stop"),
        (b"/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (b"/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
        (b"/v1/chat/completions", {**CHAT, "logprobs": 3}, "logprobs"),
        (b"/v1/completions", {**TEXT, "logprobs": 21}, "logprobs"),
        (b"/v1/completions", {**TEXT, "logprobs": True}, "logprobs"),
        (b"/v1/completions", {**TEXT, "prompt": [1, 2], "echo": True}, "echo"),
        (b"/v1/completions", {**TEXT, "prompt": [["a"]]}, "prompt"),
        (b"/v1/chat/completions", {**CHAT, "tools": "get_weather"}, "tools"),
        (b"/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, "tools"),
        (b"/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function":
            {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}},
         "tool_choice"),
        (b"/v1/chat/completions", {**CHAT, "response_format": {"type": "xml"}}, "response_format"),
        (b"/v1/chat/completions", {**CHAT, "continue_final_message": True}, "messages"),
        (b"/v1/chat/completions", {**CHAT, "continue_final_message": True,
                                   "add_generation_prompt": True}, "continue_final_message"),
    ],
)  # fmt: skip
async def test_bad_values_get_a_400_naming_what_to_change(
    worker: Worker, path: bytes, body: dict[str, object], param: str
) -> None:
    status, raw = await worker.call(b"POST", path, body)
    assert status == 400, raw
    error = json.loads(raw)["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"]


@pytest.mark.parametrize("limit", [20, None])
async def test_a_continued_stream_reads_on_where_the_cut_one_stopped(
    worker: Worker, limit: int | None
) -> None:
    """What the gateway sends another backend after a stream broke off after 7 tokens
    (resilience/continuation.py) gets the rest of the very answer the stream would have given."""
    original = {"model": "m", "messages": USER, "seed": 13, "stream": True}  # draws 34 tokens
    if limit is not None:
        original["max_tokens"] = limit
    events = await worker.stream(original)
    uncut = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    tokens = len(uncut.split())
    assert limit is None or tokens == limit
    progress = StreamProgress()
    for event in events[:8]:  # the role, then 7 tokens
        progress.feed(b"data: " + json.dumps(event).encode() + b"\n\n")
    rest = continuation_body(json.dumps(original).encode(), True, progress)
    assert rest is not None
    events = await worker.stream(json.loads(rest))
    more = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert progress.text + more == uncut
    assert events[-1]["choices"][0]["finish_reason"] == ("stop" if limit is None else "length")
