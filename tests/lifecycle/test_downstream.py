"""lifecycle/downstream.py: the Sink keeps what the lifecycle writes to its client (that the
server's ResponseWriter is a Downstream too, mypy checks where the gateway hands it on)."""

from __future__ import annotations

import pytest

from fleetgate.lifecycle.downstream import Sink


def test_a_whole_answer_is_kept_with_its_rendered_header_lines() -> None:
    sink = Sink()
    sink.send(429, [(b"content-type", b"application/json")], b"{}",
              b"retry-after: 2\r\nx-ratelimit-remaining-requests: 0\r\n")  # fmt: skip
    assert (sink.status, sink.body, sink.finished) == (429, b"{}", True)
    assert sink.header(b"retry-after") == b"2"
    assert sink.header(b"x-ratelimit-remaining-requests") == b"0"
    assert sink.header(b"content-type") == b"application/json"
    with pytest.raises(RuntimeError, match="already started"):
        sink.send(200, [], b"again")


def test_a_stream_is_kept_piece_by_piece_and_nothing_after_its_end() -> None:
    sink = Sink()
    sink.start(200, [(b"content-type", b"text/event-stream")])
    assert sink.write(b"data: 1\n\n") is True  # a sink always keeps up
    assert sink.write(b"") is True  # an empty piece is no piece
    resumed: list[bool] = []
    sink.when_drained(lambda: resumed.append(True))
    sink.end(b"data: [DONE]\n\n")
    sink.write(b"data: late\n\n")
    assert sink.chunks == [b"data: 1\n\n", b"data: [DONE]\n\n"]
    assert resumed == [True]
    assert not sink.disconnected


def test_an_aborted_answer_reads_as_a_client_gone() -> None:
    sink = Sink()
    sink.start(200, [])
    sink.write(b"data: 1\n\n")
    sink.abort()
    assert sink.aborted and sink.disconnected
    sink.write(b"data: 2\n\n")
    assert sink.body == b"data: 1\n\n"
