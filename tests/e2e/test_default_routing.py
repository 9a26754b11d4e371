"""The default profile (`balanced`) through real processes: prompts sharing a system prompt go
where it is cached, so the engines' own prefix-cache counters show the hits round robin loses."""

from __future__ import annotations

import json
import random
from pathlib import Path

import openai
import pytest

from fleetgate.tokens import filler_text
from tests.e2e.procs import gateway, metric, sim_workers

GROUPS, QUESTIONS = 3, 6  # 3 groups over 4 backends: round robin moves each group


def hit_rate(workers: list[str]) -> float:
    hits = sum(metric(w, "vllm:prefix_cache_hits_total") for w in workers)
    queries = sum(metric(w, "vllm:prefix_cache_queries_total") for w in workers)
    return hits / queries


@pytest.mark.parametrize("policy", [None, "round_robin"])
def test_shared_system_prompts_stay_where_they_are_cached(
    tmp_path: Path, policy: str | None
) -> None:
    rng = random.Random(7)
    systems = [filler_text(1500, rng) for _ in range(GROUPS)]
    with sim_workers("m", 4) as workers:
        pool: dict[str, object] = {"model": "m", "backends": [{"url": w} for w in workers]}
        if policy is not None:
            pool["policy"] = policy
        config = tmp_path / "gw.yaml"
        config.write_text(json.dumps({"pools": [pool]}))
        with gateway(["--config", str(config)]) as (url, _):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            for q in range(QUESTIONS):
                for system in systems:
                    client.chat.completions.create(
                        model="m", max_tokens=1,
                        messages=[{"role": "system", "content": system},
                                  {"role": "user", "content": f"Question {q}?"}],
                    )  # fmt: skip
            rate = hit_rate(workers)
    # One miss per group when each group keeps one home: 5 of 6 prompts hit on their ~1,500
    # shared tokens. Round robin sends each group to all 4 backends: 4 misses, 2 of 6 hit.
    if policy is None:
        assert rate > 0.75, rate
    else:
        assert rate < 0.4, rate
