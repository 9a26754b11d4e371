"""Model names that are not pools, end to end: the body's model is rewritten for the backend."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.procs import gateway, get, metric, sim_workers


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with sim_workers("small", 1) as small, sim_workers("big", 1) as big:
        config = {
            "pools": [
                {"model": "small", "backends": [{"url": small[0]}]},
                {"model": "big", "backends": [{"url": big[0]}]},
            ],
            "models": [
                {"name": "gpt-4o-mini", "alias": "small"},
                {"name": "rollout", "split": [{"model": "small", "weight": 1},
                                              {"model": "big", "weight": 1}]},
                {"name": "auto", "tiers": {"cheap": "small", "strong": "big",
                                           "keywords": ["prove"]}},
            ],
        }  # fmt: skip
        path = Path(tmp_path_factory.mktemp("models")) / "gw.yaml"
        path.write_text(json.dumps(config))
        with gateway(["--config", str(path)]) as (base, _):
            yield base


def served(url: str, model: str) -> float:
    return metric(url, "fleetgate_requests_total", model=model, status="200")


def ask(url: str, model: str, text: str, **kwargs: object) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=2, **kwargs
    )  # type: ignore[call-overload]
    return str(reply.model)


def test_an_alias_is_served_by_its_pool_and_listed(url: str) -> None:
    before = served(url, "small")
    assert ask(url, "gpt-4o-mini", "hi") == "small"  # the backend saw its own model name
    assert served(url, "small") == before + 1
    listed = {m["id"] for m in json.loads(get(url + "/v1/models")[2])["data"]}
    assert listed == {"small", "big", "gpt-4o-mini", "rollout", "auto"}


def test_tiers_send_hard_or_marked_requests_to_the_strong_pool(url: str) -> None:
    assert ask(url, "auto", "What is 2 + 2?") == "small"
    assert ask(url, "auto", "Prove that there are infinitely many primes.") == "big"
    assert ask(url, "auto", "hi", extra_headers={"x-fleetgate-tier": "strong"}) == "big"


def test_a_split_sends_each_user_to_one_side_and_uses_both(url: str) -> None:
    sides = {ask(url, "rollout", "hi", user=f"user-{i}") for i in range(16)}
    assert sides == {"small", "big"}
    assert {ask(url, "rollout", "hi", user="alice") for _ in range(5)} == {
        ask(url, "rollout", "hi", user="alice")
    }
