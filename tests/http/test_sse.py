"""The SSE decoder against the event-stream rules, fed in every possible split."""

from __future__ import annotations

import pytest

from fleetgate.http.sse import SseDecoder

STREAM = (
    b": keep-alive comment\n\n"
    b'data: {"a": 1}\n\n'
    b"event: message\nid: 7\ndata: line one\ndata: line two\n\n"
    b"data:no-space\n\n"
    b"retry: 100\n\n"
    b"data: [DONE]\n\n"
)
EVENTS = [b'{"a": 1}', b"line one\nline two", b"no-space", b"[DONE]"]


def decode_all(chunks: list[bytes]) -> list[bytes]:
    decoder = SseDecoder()
    return [event for chunk in chunks for event in decoder.feed(chunk)]


def test_whole_stream_in_one_chunk() -> None:
    assert decode_all([STREAM]) == EVENTS


def test_every_two_way_split_gives_the_same_events() -> None:
    for cut in range(len(STREAM) + 1):
        assert decode_all([STREAM[:cut], STREAM[cut:]]) == EVENTS, cut


def test_byte_by_byte() -> None:
    assert decode_all([STREAM[i : i + 1] for i in range(len(STREAM))]) == EVENTS


@pytest.mark.parametrize("newline", [b"\r\n", b"\r"])
def test_crlf_and_cr_line_endings_split_anywhere(newline: bytes) -> None:
    stream = STREAM.replace(b"\n", newline)
    assert decode_all([stream]) == EVENTS
    for cut in range(len(stream) + 1):
        assert decode_all([stream[:cut], stream[cut:]]) == EVENTS, cut


def test_several_events_per_chunk_and_a_partial_one_kept() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: 1\n\ndata: 2\n\ndata: 3") == [b"1", b"2"]
    assert decoder.feed(b"\n") == []
    assert decoder.feed(b"\n") == [b"3"]


def test_event_without_data_is_not_dispatched_but_empty_data_is() -> None:
    assert decode_all([b"event: ping\n\n: only a comment\n\ndata\n\ndata:\n\n"]) == [b"", b""]


def test_only_one_space_after_the_colon_is_dropped_and_other_fields_ignored() -> None:
    assert decode_all([b"data:  two spaces\ndatabase: x\n\n"]) == [b" two spaces"]


def test_leading_byte_order_mark_is_skipped() -> None:
    assert decode_all([b"\xef\xbb\xbfdata: x\n\n"]) == [b"x"]


def test_blank_line_runs_do_not_make_events() -> None:
    assert decode_all([b"\n\n\n\ndata: x\n\n\n\n"]) == [b"x"]


def test_empty_chunks_between_cr_and_lf_change_nothing() -> None:
    assert decode_all([b"data: x\r", b"", b"\n\r", b"", b"\n"]) == [b"x"]
