"""examples/multi-tenant.yaml runs as the README says, and its keys do what its comments say."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.procs import gateway

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multi-tenant.yaml"
SMALL, LARGE = "llama-3.1-8b-instruct", "llama-3.3-70b-instruct"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with gateway(["--config", str(EXAMPLE)]) as (base, proc):
        proc.wait_for(r"(auth: on)")
        yield base


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def ask(c: openai.OpenAI, model: str = SMALL) -> openai.types.chat.ChatCompletion:
    return c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
    )


def test_each_example_key_works_and_no_key_is_refused(url: str) -> None:
    for key in ("sk-gold-example", "sk-silver-example", "sk-bronze-example", "sk-batch-example"):
        assert ask(client(url, key)).choices[0].message.content
    with pytest.raises(openai.AuthenticationError):
        ask(client(url, "sk-not-an-example"))


def test_bronze_is_rate_limited_and_batch_is_kept_to_the_small_model(url: str) -> None:
    raw = client(url, "sk-bronze-example").chat.completions.with_raw_response.create(
        model=SMALL, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
    )
    assert raw.headers["x-ratelimit-limit-requests"] == "60"
    with pytest.raises(openai.PermissionDeniedError):
        ask(client(url, "sk-batch-example"), LARGE)
    assert ask(client(url, "sk-gold-example"), LARGE).choices[0].message.content
