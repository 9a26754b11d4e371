"""The Responses API on a real sim worker, read by the official openai SDK (streams through
its own event types and stream helper)."""

from __future__ import annotations

import json

import openai

from tests.workers.sim.conftest import Worker


async def test_a_response_whole_completed_or_incomplete(sdk: openai.AsyncOpenAI) -> None:
    cut = await sdk.responses.create(
        model="m", input="hello there", instructions="be brief", max_output_tokens=5
    )
    assert cut.id.startswith("resp_") and cut.object == "response"
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    (message,) = cut.output
    assert message.type == "message" and message.role == "assistant"
    assert len(cut.output_text.split()) == 5
    assert cut.usage is not None and cut.usage.output_tokens == 5
    assert cut.usage.total_tokens == cut.usage.input_tokens + 5
    assert cut.usage.input_tokens_details.cached_tokens == 0
    items = [{"role": "user", "content": [{"type": "input_text", "text": "hello there"}]}]
    done = await sdk.responses.create(model="m", input=items)
    assert done.status == "completed" and done.incomplete_details is None
    assert done.output_text and done.usage is not None
    assert done.usage.output_tokens == len(done.output_text.split())


async def test_a_streamed_response_as_openai_streams_it(sdk: openai.AsyncOpenAI) -> None:
    async with sdk.responses.stream(model="m", input="hello there") as stream:
        kinds, deltas = [], []
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = await stream.get_final_response()
    head = ["response.created", "response.in_progress", "response.output_item.added",
            "response.content_part.added"]  # fmt: skip
    tail = ["response.output_text.done", "response.content_part.done",
            "response.output_item.done", "response.completed"]  # fmt: skip
    assert kinds == [*head, *["response.output_text.delta"] * len(deltas), *tail]
    assert final.status == "completed" and final.output_text == "".join(deltas)
    assert final.usage is not None and final.usage.output_tokens == len(deltas)

    events = await sdk.responses.create(model="m", input="hi", max_output_tokens=3, stream=True)
    seen = [event async for event in events]
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    last = seen[-1]
    assert last.type == "response.completed" and last.response.status == "incomplete"


async def test_what_the_sim_cannot_answer_is_a_400(worker: Worker) -> None:
    for body, param in (({"model": "m", "input": [{"type": "function_call_output"}]}, "input"),
                        ({"model": "m", "input": [{"role": "user", "content": [5]}]}, "input"),
                        ({"model": "m", "input": "x", "max_output_tokens": 0},
                         "max_output_tokens")):  # fmt: skip
        status, raw = await worker.call(b"POST", b"/v1/responses", body)
        assert status == 400 and json.loads(raw)["error"]["param"] == param


async def test_a_follow_up_needs_a_response_this_worker_stored(worker: Worker) -> None:
    status, raw = await worker.call(b"POST", b"/v1/responses", {"model": "m", "input": "hi"})
    first = json.loads(raw)["id"]
    assert status == 200 and first.startswith("resp_") and len(first) > 12  # unique per worker
    follow = {"model": "m", "input": "and?", "previous_response_id": first}
    status, raw = await worker.call(b"POST", b"/v1/responses", follow)
    assert status == 200 and json.loads(raw)["id"] != first
    stranger = {**follow, "previous_response_id": "resp_elsewhere1"}
    status, raw = await worker.call(b"POST", b"/v1/responses", stranger)
    assert status == 404 and "not found" in json.loads(raw)["error"]["message"]
