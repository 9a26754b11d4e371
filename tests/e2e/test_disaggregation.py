"""Prefill/decode disaggregation through real processes: the prefill sim computes the prompt,
the decode sim receives its KV and streams the answer, and the client sees one answer."""

from __future__ import annotations

import json
from pathlib import Path

import openai

from tests.e2e.procs import gateway, metric, sim_workers

PROMPT = " the" * 1500  # about 1,500 tokens: 93 full KV blocks of 16


def test_a_disaggregated_pool_prefills_on_one_backend_and_decodes_on_another(
    tmp_path: Path,
) -> None:
    with sim_workers("m", 1) as prefill, sim_workers("m", 1) as decode:
        config = {"pools": [{"model": "m", "backends": [{"url": decode[0]}],
                             "prefill": {"backends": [{"url": prefill[0]}]}}]}  # fmt: skip
        path = tmp_path / "gw.yaml"
        path.write_text(json.dumps(config))
        with gateway(["--config", str(path)]) as (url, _):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            stream = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=8,
                stream=True, stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = list(stream)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usage = chunks[-1].usage
            assert len(text.split()) == 8
            assert usage is not None and usage.prompt_tokens_details is not None
            # The decode engine found the whole prompt but its last block cached: handed over.
            assert usage.prompt_tokens_details.cached_tokens >= 1488
            assert metric(prefill[0], "vllm:request_success_total") == 1  # the one-token half
            assert metric(prefill[0], "vllm:generation_tokens_total") == 1
            assert metric(decode[0], "vllm:generation_tokens_total") == 8
            assert metric(url, "fleetgate_backend_pending_prefill_tokens") == 0
            assert metric(url, "fleetgate_backend_in_flight_tokens") == 0


def test_without_a_working_prefill_backend_the_decode_backend_prefills_itself(
    tmp_path: Path,
) -> None:
    with sim_workers("m", 1) as decode:
        dead = "http://127.0.0.1:9"  # nothing listens: every prefill attempt is refused
        config = {"pools": [{"model": "m", "backends": [{"url": decode[0]}],
                             "prefill": {"backends": [{"url": dead}]}}]}  # fmt: skip
        path = tmp_path / "gw.yaml"
        path.write_text(json.dumps(config))
        with gateway(["--config", str(path)]) as (url, _):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            reply = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=4
            )
            assert reply.usage is not None and reply.usage.completion_tokens == 4
            assert reply.usage.prompt_tokens_details is not None
            assert reply.usage.prompt_tokens_details.cached_tokens == 0  # prefilled here
            assert metric(url, "fleetgate_upstream_errors_total", kind="connect") >= 1
