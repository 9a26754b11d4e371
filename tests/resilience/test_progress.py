"""What a stream's progress records: the text, tokens, id and end of what the client was sent."""

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


def test_plain_events_give_text_tokens_id_and_the_end() -> None:
    progress = _fed(
        _event(""), _event("Hel"), _event("lo"), _event(None, "stop"), b"data: [DONE]\n\n"
    )
    assert (progress.text, progress.tokens, progress.events) == ("Hello", 2, 4)
    assert (progress.id, progress.created) == ("c-1", 7)
    assert progress.finished and progress.done


def test_several_events_in_one_read_count_like_one_by_one() -> None:
    events = [_event(str(i)) for i in range(100)]
    assert _fed(b"".join(events)).tokens == _fed(*events).tokens == 100
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
    assert (progress.text, progress.tokens, progress.done) == ("ab", 2, True)
    assert progress.events == 3  # the comment is no data event, [DONE] is not counted


def test_a_completion_stream_counts_its_text() -> None:
    chunk = b'data: {"id":"cmpl-1","created":1,"choices":[{"text":"hi","finish_reason":null}]}\n\n'
    assert _fed(chunk, chunk).text == "hihi"


def test_the_first_id_is_kept_and_settling_twice_changes_nothing() -> None:
    progress = _fed(_event("a", id_="first"), _event("b", id_="second"))
    progress.settle()
    assert (progress.id, progress.tokens) == ("first", 2)
    assert not progress.finished and not progress.done
