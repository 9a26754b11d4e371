"""The request log of a real gateway process, on its standard output (a pipe: JSON lines),
for requests sent with the official openai SDK."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.procs import Proc, gateway, sim_workers

MODEL = "sim-8b"
KEY = "sk-request-log-test-key"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Proc]]:
    with sim_workers(MODEL, 1) as workers:
        config = {
            "tenants": [{"name": "gold", "keys": [KEY], "priority": "critical"}],
            "pools": [{
                "model": MODEL, "policy": "round_robin", "backends": [{"url": workers[0]}],
                "pricing": {"input_per_1m_usd": 1.0, "output_per_1m_usd": 2.0},
            }],
            "request_log": {"flush_s": 0.05},
        }  # fmt: skip
        path = tmp_path_factory.mktemp("gw") / "gw.yaml"
        path.write_text(json.dumps(config))
        with gateway(["--config", str(path)]) as (url, proc):
            yield url, proc


def logged(proc: Proc, request_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The log line of `request_id`, waiting for it to be written."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(proc.lines):
            if line.startswith("{") and f'"request_id":"{request_id}"' in line:
                parsed: dict[str, Any] = json.loads(line)
                return parsed
        time.sleep(0.05)
    raise AssertionError(f"no log line for {request_id}:\n" + "\n".join(proc.lines[-20:]))


def test_each_request_is_one_json_line_with_its_tenant_backend_tokens_and_cost(
    fleet: tuple[str, Proc],
) -> None:
    url, proc = fleet
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    answer = raw.parse()
    assert answer.usage is not None
    line = logged(proc, raw.headers["x-request-id"])
    assert line["tenant"] == "gold" and line["priority"] == "critical"
    assert (line["status"], line["outcome"], line["model"], line["attempts"]) == (
        200, "answered", MODEL, 1
    )  # fmt: skip
    assert line["backend"].startswith("127.0.0.1:")
    assert (line["prompt_tokens"], line["completion_tokens"]) == (
        answer.usage.prompt_tokens, answer.usage.completion_tokens
    )  # fmt: skip
    expected = (answer.usage.prompt_tokens * 1.0 + answer.usage.completion_tokens * 2.0) / 1e6
    assert line["cost_usd"] == pytest.approx(expected)
    assert 0 < line["e2e_ms"] < 10_000
    assert "ttft_ms" not in line  # a whole answer has no first token of its own

    stream = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count."}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    events = list(stream.parse())
    assert events
    line = logged(proc, stream.headers["x-request-id"])
    # A stream's output is counted as its usage says (else estimated from its text).
    assert line["status"] == 200 and line["completion_tokens"] == 5
    assert 0 < line["ttft_ms"] <= line["e2e_ms"]


def test_a_refused_request_is_logged_with_its_reason_and_never_with_the_key(
    fleet: tuple[str, Proc],
) -> None:
    url, proc = fleet
    bad = "sk-not-a-key-of-this-gateway"
    client = openai.OpenAI(base_url=url + "/v1", api_key=bad, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    request_id = caught.value.response.headers["x-request-id"]
    line = logged(proc, request_id)
    assert (line["status"], line["outcome"], line["reason"]) == (401, "rejected", "invalid_api_key")
    assert "backend" not in line and "model" not in line
    assert not any(bad in out or KEY in out for out in proc.lines)
    assert not any("Say hello." in out for out in proc.lines)  # no prompt text either
