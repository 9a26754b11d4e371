"""A replayed stream rewritten into the rest of the one the client has: what the client has is
swallowed exactly, however the new backend cuts its events; what differs ends the replay."""

from __future__ import annotations

from typing import Any

import msgspec

from fleetgate.resilience.replay import Replayer
from fleetgate.upstream.progress import StreamProgress


def event(*choices: dict[str, Any], stream_id: str = "s1", **extra: Any) -> bytes:
    chunk = {"id": stream_id, "created": 9, "choices": list(choices), **extra}
    return b"data: " + msgspec.json.encode(chunk) + b"\n\n"


def say(index: int, text: str, *entries: str, finish: str | None = None) -> dict[str, Any]:
    """A chat choice's delta with `text`, and logprobs entries for `entries` if any."""
    logprobs = {"content": [{"token": t, "logprob": -1.0} for t in entries]} if entries else None
    return {"index": index, "delta": {"content": text}, "logprobs": logprobs,
            "finish_reason": finish}  # fmt: skip


def call(arguments: str, head: str | None = None) -> dict[str, Any]:
    """A tool-call delta of call 0; with `head`, the call's head (id, type, name)."""
    delta: dict[str, Any] = {"index": 0, "function": {"arguments": arguments}}
    if head is not None:
        delta |= {"id": head, "type": "function"}
        delta["function"]["name"] = "get_weather"
    return {"index": 0, "delta": {"tool_calls": [delta]}, "finish_reason": None}


def tool(arguments: str, head: str | None = None) -> bytes:
    return event(call(arguments, head))


def sent(*events: bytes) -> StreamProgress:
    progress = StreamProgress()
    for e in events:
        progress.feed(e.replace(b'"s1"', b'"s0"').replace(b'"created":9', b'"created":7'))
    return progress


def chunks(out: bytes) -> list[Any]:
    return [
        "[DONE]" if e == b"data: [DONE]" else msgspec.json.decode(e[6:])
        for e in out.split(b"\n\n")
        if e
    ]


def test_the_text_sent_is_swallowed_even_where_it_ends_mid_event() -> None:
    progress = sent(event(say(0, "Hel")), event(say(0, "lo wor")))
    replay = Replayer(progress)
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    out = replay.rewrite(event(role) + event(say(0, "Hello")) + event(say(0, " w")))
    assert out == b""  # all of it the client's
    out = replay.rewrite(event(say(0, "orld")) + event(say(0, "!", finish="stop")))
    got = chunks(out + replay.rewrite(b"data: [DONE]\n\n"))
    assert [c["choices"][0]["delta"] for c in got[:-1]] == [{"content": "ld"}, {"content": "!"}]
    assert got[1]["choices"][0]["finish_reason"] == "stop" and got[-1] == "[DONE]"
    assert {(c["id"], c["created"]) for c in got[:-1]} == {("s0", 7)}  # the stream's own
    assert replay.diverged is None


def test_logprobs_entries_sent_are_dropped_with_their_tokens() -> None:
    progress = sent(event(say(0, "ab", "a", "b")))
    replay = Replayer(progress)
    got = chunks(replay.rewrite(event(say(0, "a", "a")) + event(say(0, "bc", "b", "c"))))
    (chunk,) = got
    choice = chunk["choices"][0]
    assert choice["delta"] == {"content": "c"}
    assert [e["token"] for e in choice["logprobs"]["content"]] == ["c"]


def test_a_tool_call_cut_mid_arguments_goes_on_without_a_second_head() -> None:
    progress = sent(tool("", head="call_A"), tool('{"ci'))
    replay = Replayer(progress)
    out = replay.rewrite(tool("", head="call_B") + tool('{"c') + tool('ity": "P') + tool('aris"}'))
    deltas = [c["choices"][0]["delta"]["tool_calls"] for c in chunks(out)]
    assert deltas == [
        [{"index": 0, "function": {"arguments": 'ty": "P'}}],
        [{"index": 0, "function": {"arguments": 'aris"}'}}],
    ]  # the client keeps call_A's head: no id, type or name again
    assert replay.diverged is None


def test_a_choice_the_client_has_none_of_passes_whole_and_usage_passes_as_it_came() -> None:
    progress = sent(event(say(0, "x")))
    replay = Replayer(progress)
    role = {"index": 1, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    usage = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    out = replay.rewrite(
        event(say(0, "x")) + event(role) + event(say(1, "y"))
        + event(say(0, "", finish="stop")) + event(usage=usage)
    )  # fmt: skip
    got = chunks(out)
    assert [c["choices"] for c in got[:2]] == [[role], [say(1, "y")]]
    assert got[2]["choices"][0]["finish_reason"] == "stop"
    assert got[3]["usage"] == usage and got[3]["choices"] == []


def test_a_finish_the_client_has_is_not_sent_again() -> None:
    progress = sent(event(say(0, "a", finish="stop")), event(say(1, "b")))
    replay = Replayer(progress)
    out = replay.rewrite(event(say(0, "a", finish="stop")) + event(say(1, "bc")))
    assert [c["choices"] for c in chunks(out)] == [[say(1, "c")]]


def test_a_replay_that_differs_stops_and_says_why() -> None:
    stopped: list[bool] = []
    progress = sent(event(say(0, "Hello")), event(say(1, "Hi")))
    replay = Replayer(progress)
    replay.on_diverged = lambda: stopped.append(True)
    out = replay.rewrite(event(say(1, "Hi")) + event(say(1, " there")) + event(say(0, "Help")))
    assert [c["choices"] for c in chunks(out)] == [[say(1, " there")]]  # what came before
    assert replay.diverged is not None and "choice 0" in replay.diverged and stopped
    assert replay.rewrite(event(say(0, "lo"))) == b""  # nothing passes after


def test_a_replay_that_ends_short_of_what_was_sent_differs() -> None:
    replay = Replayer(sent(event(say(0, "Hello"))))
    out = replay.rewrite(event(say(0, "Hel", finish="stop")) + b"data: [DONE]\n\n")
    assert out == b"" and replay.diverged is not None


def test_a_call_with_other_arguments_or_another_name_differs() -> None:
    replay = Replayer(sent(tool("", head="call_A"), tool('{"city"')))
    replay.rewrite(tool("", head="call_B") + tool('{"town"'))
    assert replay.diverged is not None and "arguments" in replay.diverged
    other = call("", head="call_B")
    other["delta"]["tool_calls"][0]["function"]["name"] = "get_time"
    replay = Replayer(sent(tool("", head="call_A")))
    replay.rewrite(event(other))
    assert replay.diverged is not None and "name" in replay.diverged
