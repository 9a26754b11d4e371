"""A saturated pool at a real gateway: requests wait for a place, and one whose deadline
passes first gets 503 with Retry-After, counted in the metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from tests.e2e.procs import gateway, metric, sim_workers

MODEL = "sim-8b"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with sim_workers(MODEL, 1) as workers:
        config = {
            "pools": [{
                "model": MODEL, "policy": "round_robin",
                "backends": [{"url": workers[0]}],
                "admission": {"limit": {"max_in_flight": 1}},
            }],
        }  # fmt: skip
        path = tmp_path_factory.mktemp("gw") / "gw.yaml"
        path.write_text(json.dumps(config))
        with gateway(["--config", str(path)]) as (base, _):
            yield base


def test_a_request_that_cannot_get_a_place_in_time_is_shed_with_retry_after(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Tell a long story."}]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=400,
        stream=True,  # type: ignore[arg-type]
    )
    chunks = iter(stream)
    next(chunks)  # admitted and streaming: it holds the pool's one place
    with pytest.raises(openai.InternalServerError, match="No place opened") as info:
        client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=4,  # type: ignore[arg-type]
            extra_headers={"x-fleetgate-queue-timeout-s": "0.2"},
        )  # fmt: skip
    assert info.value.status_code == 503
    assert int(info.value.response.headers["retry-after"]) >= 1
    assert sum(1 for _ in chunks) > 100  # the first stream ends whole
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)  # type: ignore[arg-type]
    assert reply.choices[0].message.content
    assert metric(url, "fleetgate_rejected_total", reason="queue_timeout") == 1
    assert metric(url, "fleetgate_admitted_total", tenant="anonymous", priority="standard") == 2
    assert metric(url, "fleetgate_admission_limit_requests", model=MODEL) == 1


def test_a_bad_admission_header_is_a_400(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    for header, value in (("x-fleetgate-queue-timeout-s", "soon"),
                          ("x-fleetgate-priority", "urgent")):  # fmt: skip
        with pytest.raises(openai.BadRequestError, match=header):
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2,
                extra_headers={header: value},
            )  # fmt: skip
