"""How a broken stream goes on, by the engine of the backend that takes it over."""

from __future__ import annotations

import json

from fleetgate.resilience.continuation import plan_continuation
from fleetgate.upstream.progress import StreamProgress


def _progress(*texts: str) -> StreamProgress:
    progress = StreamProgress()
    for text in texts:
        chunk = {"id": "c1", "created": 1, "choices": [{"index": 0, "delta": {"content": text}}]}
        progress.feed(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    return progress


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}


def test_vllm_is_asked_to_continue_the_final_message_and_llama_cpp_is_sent_a_plain_prefill() -> (
    None
):
    original = json.dumps(CHAT).encode()
    for resume, told in (("continue_final_message", True), ("assistant_prefill", False)):
        plan = plan_continuation(original, True, _progress("Hello", " there"), resume)
        assert plan.way == "prefill"
        body = json.loads(plan.body)
        assert body["messages"][-1] == {"role": "assistant", "content": "Hello there"}
        assert body["max_tokens"] == 8
        assert ("continue_final_message" in body) is told
        assert ("add_generation_prompt" in body) is told


def test_an_engine_that_cannot_continue_gets_a_replay_or_the_client_an_error() -> None:
    seeded = json.dumps({**CHAT, "seed": 3}).encode()
    assert plan_continuation(seeded, True, _progress("Hello"), "none").way == "replay"
    refused = plan_continuation(json.dumps(CHAT).encode(), True, _progress("Hello"), "none")
    assert refused.way == "refused"
    assert "cannot continue an answer" in refused.why and "seed" in refused.why
