"""Streams cut mid-answer and continued on another worker (issue 19.4): tool calls, logprobs and
several choices reach the client, assembled by the openai SDK, exactly as one worker's
unbroken answer to the same request; a request that cannot be resumed faithfully gets a clear
error. Real sim workers, a real gateway, the first worker cutting every stream after a few
tokens (close_after_tokens); round robin sends one request in two to it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.procs import gateway, metric
from tests.e2e.test_backend_failures import MODEL, set_faults, start_workers

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "days", "unit"],
        },
    },
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(the gateway's URL, the cutting worker's, the other worker's)."""
    with ExitStack() as stack:
        (cutting, _), (whole, _) = start_workers(stack, 2)
        config = Path(tmp_path_factory.mktemp("gw")) / "gw.yaml"
        pool = {"model": MODEL, "policy": "round_robin",
                "backends": [{"url": cutting}, {"url": whole}],
                # The cuts are the test's: the cutting worker must stay in rotation.
                "outlier": {"consecutive_failures": 1000, "min_requests": 1000}}  # fmt: skip
        config.write_text(json.dumps({"pools": [pool]}))
        url, _ = stack.enter_context(gateway(["--config", str(config)]))
        yield url, cutting, whole


def assembled(base_url: str, **request: Any) -> dict[str, Any]:
    """The answer as the SDK's stream helper assembles it (ids and times aside)."""
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    with client.chat.completions.stream(
        model=MODEL, messages=[{"role": "user", "content": "tell me"}],
        stream_options={"include_usage": True}, **request,
    ) as stream:  # fmt: skip
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.usage is not None
    return {"choices": [c.model_dump() for c in final.choices],
            "completion_tokens": final.usage.completion_tokens}  # fmt: skip


def check_continued(fleet: tuple[str, str, str], cut_after: int, **request: Any) -> None:
    """Through the gateway, twice (one starts on the cutting worker), the answer is the one
    the other worker gives unbroken."""
    url, cutting, whole = fleet
    set_faults(cutting, close_after_tokens=0)
    unbroken = assembled(whole, **request)
    set_faults(cutting, close_after_tokens=cut_after)
    before = metric(url, "fleetgate_stream_continuations_total")
    for _ in range(2):
        assert assembled(url, **request) == unbroken
    assert metric(url, "fleetgate_stream_continuations_total") > before


def test_a_tool_call_cut_mid_arguments_is_assembled_as_one_worker_s(
    fleet: tuple[str, str, str],
) -> None:
    check_continued(fleet, 4, tools=[WEATHER], tool_choice="required", seed=7)


def test_a_logprobs_stream_cut_midway_is_assembled_as_one_worker_s(
    fleet: tuple[str, str, str],
) -> None:
    check_continued(fleet, 5, logprobs=True, top_logprobs=2, seed=8)  # 14 tokens, "stop"


def test_two_choices_cut_midway_are_assembled_as_one_worker_s(
    fleet: tuple[str, str, str],
) -> None:
    check_continued(fleet, 7, n=2, seed=96)  # 11 and 31 tokens


def test_a_cut_stream_without_a_seed_ends_with_a_clear_error(
    fleet: tuple[str, str, str],
) -> None:
    url, cutting, _ = fleet
    set_faults(cutting, close_after_tokens=5)
    errors = []
    for _ in range(2):
        try:
            assembled(url, n=2, max_tokens=10)
        except openai.LengthFinishReasonError:
            pass  # the stream that was not cut: whole, and 10 tokens long
        except openai.APIError as exc:
            errors.append(exc)
    (error,) = errors
    assert isinstance(error.body, dict) and error.body["code"] == "stream_not_resumable"
    assert "seed" in error.message
