"""A Responses API stream's progress: complete at its terminal event, its usage read from it."""

from __future__ import annotations

from fleetgate.upstream.responses_progress import ResponsesProgress


def _event(kind: str, data: str) -> bytes:
    return f"event: {kind}\ndata: {data}\n\n".encode()


def test_deltas_are_estimated_from_their_text_until_the_terminal_event_gives_the_usage() -> None:
    progress = ResponsesProgress()
    progress.feed(_event("response.created", '{"type":"response.created"}'))
    text = '{"type":"response.output_text.delta","delta":"ab \\"cd\\""}'  # 9 bytes as sent
    delta = _event("response.output_text.delta", text)
    progress.feed(delta * 3)
    assert (progress.tokens, progress.deltas, progress.events, progress.done) == (7, 3, 4, False)
    usage = '{"input_tokens":7,"output_tokens":3,"total_tokens":10}'
    progress.feed(delta + _event("response.completed", f'{{"response":{{"usage":{usage}}}}}'))
    assert progress.done and progress.finished and progress.deltas == 4
    progress.settle()
    assert progress.tokens == 3  # the engine's count
    assert progress.reported is not None
    assert (progress.reported.prompt_tokens, progress.reported.completion_tokens) == (7, 3)


def test_an_error_event_ends_the_stream_and_a_text_mentioning_one_does_not() -> None:
    progress = ResponsesProgress()
    # A delta whose text names the terminal event is not one: only an `event:` line counts.
    progress.feed(_event("response.output_text.delta", '{"delta":"event: error\\n"}'))
    assert not progress.done
    progress.feed(_event("error", '{"type":"error","code":"x","message":"m"}'))
    assert progress.done
    progress.settle()
    assert progress.reported is None  # no usage in an error: the relayed deltas count instead


def test_the_response_s_id_is_read_from_its_first_event_only() -> None:
    progress = ResponsesProgress()
    progress.feed(_event("response.created", '{"response":{"id":"resp_abc1","status":"x"}}'))
    progress.feed(_event("response.output_text.delta", '{"delta":"\\"id\\":\\"resp_zzz\\""}'))
    assert progress.id == "resp_abc1"
