"""The sim worker over real HTTP on localhost: OpenAI answers, peer endpoints, fault injection."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetgate.http.client import HttpClient, Origin
from fleetgate.http.errors import ConnectError, ReadError, UpstreamError
from fleetgate.workers.sim.engine import Engine, EngineRequest
from fleetgate.workers.sim.profiles import get_profile
from fleetgate.workers.sim.prompt import synthetic
from fleetgate.workers.sim.spec import SimSpec
from fleetgate.workers.sim.worker import SimWorker
from tests.workers.sim.conftest import JSON, Worker

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6}


async def test_chat_answers_exactly_max_tokens_with_usage(worker: Worker) -> None:
    status, body = await worker.call(b"POST", b"/v1/chat/completions", CHAT)
    reply = json.loads(body)
    assert status == 200
    assert reply["usage"]["completion_tokens"] == 6
    assert reply["choices"][0]["finish_reason"] == "length"
    assert len(reply["choices"][0]["message"]["content"].split()) == 6


async def test_a_stream_carries_the_role_with_the_first_token_then_usage(worker: Worker) -> None:
    events = await worker.stream(
        {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    )
    first = events[0]["choices"][0]["delta"]  # type: ignore[index]
    assert first == {"role": "assistant", "content": ""}
    contents = [e["choices"][0]["delta"].get("content") for e in events[1:-2]]  # type: ignore[index]
    assert len(contents) == 6
    assert all(contents)
    assert events[-2]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert events[-1]["usage"]["completion_tokens"] == 6  # type: ignore[index]


async def test_token_id_prompts_and_the_same_prompt_hits_the_prefix_cache(worker: Worker) -> None:
    body = {"model": "m", "prompt": list(range(200)), "max_tokens": 1}
    _, first = await worker.call(b"POST", b"/v1/completions", body)
    _, second = await worker.call(b"POST", b"/v1/completions", body)
    assert json.loads(first)["usage"]["prompt_tokens"] == 200
    assert json.loads(second)["usage"]["prompt_tokens_details"]["cached_tokens"] >= 192


async def test_bad_requests_get_openai_errors(worker: Worker) -> None:
    status, body = await worker.call(b"POST", b"/v1/chat/completions", {**CHAT, "model": "x"})
    assert status == 404
    assert json.loads(body)["error"]["param"] == "model"
    too_long = {**CHAT, "max_tokens": 200_000}
    status, body = await worker.call(b"POST", b"/v1/chat/completions", too_long)
    assert status == 400
    assert "maximum context length" in json.loads(body)["error"]["message"]


async def test_peer_endpoints(worker: Worker) -> None:
    await worker.call(b"POST", b"/v1/chat/completions", CHAT)
    status, metrics = await worker.call(b"GET", b"/metrics")
    assert status == 200
    for name in (b"vllm:num_requests_running", b"vllm:kv_cache_usage_perc",
                 b"vllm:prefix_cache_hits_total", b"vllm:time_to_first_token_seconds_bucket",
                 b"vllm:cache_config_info"):  # fmt: skip
        assert name in metrics
    status, load = await worker.call(b"GET", b"/get_load")
    assert json.loads(load)[0]["num_reqs"] == 0
    status, _ = await worker.call(b"POST", b"/flush_cache")
    assert status == 200
    assert (await worker.call(b"GET", b"/health"))[0] == 200


async def test_step_histograms_count_every_step_and_every_decode_gap(worker: Worker) -> None:
    await worker.call(b"POST", b"/v1/chat/completions", CHAT)
    _, text = await worker.call(b"GET", b"/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    samples = {s.name: s.value for f in families.values() for s in f.samples}
    # 6 tokens from one prompt: a prefill step with the first, then 5 decode steps of 1 token.
    assert samples["vllm:iteration_tokens_total_count"] == 6
    prompt = samples["vllm:prompt_tokens_total"]
    assert samples["vllm:iteration_tokens_total_sum"] == prompt + 5
    assert samples["vllm:inter_token_latency_seconds_count"] == 5
    # Each gap is one decode step of an 8B model on an H100: a few milliseconds.
    assert 0.002 < samples["vllm:inter_token_latency_seconds_sum"] / 5 < 0.05


async def test_a_stream_takes_as_long_as_the_modelled_gpu_not_longer(worker: Worker) -> None:
    """Timer lateness (a millisecond a step) must not add up: 300 decode steps of ~4.6 ms."""
    profile = get_profile("h100-llama3-8b")
    engine = Engine(profile)
    engine.add_request(EngineRequest("r", synthetic(2, profile.block_size, 0), 300, 0.0))
    modelled = 0.0
    while engine.has_work():
        modelled += engine.step(modelled).duration_s
    body = {"model": "m", "prompt": "hi", "max_tokens": 300}
    started = asyncio.get_running_loop().time()
    status, _ = await worker.call(b"POST", b"/v1/completions", body)
    took = asyncio.get_running_loop().time() - started
    assert status == 200
    assert modelled < took < modelled * 1.05  # 1.13x before the timeline caught up
    _, text = await worker.call(b"GET", b"/metrics")
    assert b"fleetgate_sim_lost_seconds_total" in text


async def set_faults(worker: Worker, **faults: object) -> None:
    status, body = await worker.call(b"POST", b"/admin/faults", faults)
    assert status == 200, body


async def test_injected_errors_carry_retry_after_for_backpressure(worker: Worker) -> None:
    await set_faults(worker, error_rate=1.0, error_status=503)
    response = await worker.client.request(
        worker.origin, b"POST", b"/v1/chat/completions", JSON, json.dumps(CHAT).encode()
    )
    await response.read()
    assert response.status == 503
    assert response.header(b"retry-after") == b"1"
    await set_faults(worker, error_rate=0.0)
    assert (await worker.call(b"POST", b"/v1/chat/completions", CHAT))[0] == 200


async def test_crash_after_n_serves_n_then_stops_listening(worker: Worker) -> None:
    await set_faults(worker, crash_after=2)
    for _ in range(2):
        assert (await worker.call(b"POST", b"/v1/chat/completions", CHAT))[0] == 200
    with pytest.raises(UpstreamError):
        await worker.call(b"POST", b"/v1/chat/completions", CHAT)
    with pytest.raises(ConnectError):
        await HttpClient().request(worker.origin, b"GET", b"/health", [])


async def test_close_after_tokens_cuts_the_stream(worker: Worker) -> None:
    await set_faults(worker, close_after_tokens=3)
    with pytest.raises(ReadError):
        await worker.stream({**CHAT, "max_tokens": 50, "stream": True})


async def test_hang_accepts_and_never_answers(worker: Worker) -> None:
    await set_faults(worker, hang=True)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(worker.call(b"POST", b"/v1/chat/completions", CHAT), 0.3)
    await set_faults(worker, hang=False)  # the admin endpoint still answers while hanging
    assert (await worker.call(b"GET", b"/health"))[0] == 200


async def test_bad_faults_are_refused(worker: Worker) -> None:
    status, body = await worker.call(b"POST", b"/admin/faults", {"error_rate": 2})
    assert status == 400
    assert b"error_rate" in body
    status, body = await worker.call(b"POST", b"/admin/faults", {"nonsense": 1})
    assert status == 400
    assert b"nonsense" in body


async def test_a_prefill_hands_off_kv_transfer_params_and_a_decode_skips_the_prefill(
    worker: Worker,
) -> None:
    """vLLM's disaggregation protocol: the same worker plays both roles here; a fresh prompt
    is cached on the decode side only because its KV was handed over."""
    long = {"role": "user", "content": " the" * 2000}
    handoff = {"do_remote_decode": True, "do_remote_prefill": False}
    prefill = {**CHAT, "messages": [long], "max_tokens": 1, "kv_transfer_params": handoff}
    status, body = await worker.call(b"POST", b"/v1/chat/completions", prefill)
    params = json.loads(body)["kv_transfer_params"]
    assert status == 200 and params["do_remote_prefill"] is True
    assert len(params["remote_block_ids"]) >= 2000 // 16
    plain = await worker.call(b"POST", b"/v1/chat/completions", CHAT)
    assert "kv_transfer_params" not in json.loads(plain[1])  # only prefills hand off
    fresh = {"role": "user", "content": " of" * 2000}  # never prefilled on this worker
    decode = {**CHAT, "messages": [fresh], "kv_transfer_params": params}
    status, body = await worker.call(b"POST", b"/v1/chat/completions", decode)
    details = json.loads(body)["usage"]["prompt_tokens_details"]
    assert status == 200 and details["cached_tokens"] >= 1984  # all but a partial block


async def test_a_handed_over_prompt_waits_for_its_kv_to_cross_the_link() -> None:
    """2,000 prompt tokens of 128 KiB KV at 1 Gb/s: ~2.1 s before the first token; at the
    default 200 Gb/s ~10 ms."""
    loop = asyncio.get_running_loop()
    client = HttpClient()
    waited = {}
    for gbps in (1.0, 200.0):
        spec = SimSpec(model="m", profile="h100-llama3-8b", kv_link_gbps=gbps)
        sim = SimWorker(spec, random.Random(7), loop)
        server = await sim.start("127.0.0.1", 0)
        worker = Worker(client, Origin.parse(f"http://127.0.0.1:{server.port}"))
        params = {"do_remote_prefill": True, "do_remote_decode": False}
        decode = {**CHAT, "max_tokens": 1, "kv_transfer_params": params,
                  "messages": [{"role": "user", "content": " of" * 2000}]}  # fmt: skip
        started = loop.time()
        status, body = await worker.call(b"POST", b"/v1/chat/completions", decode)
        waited[gbps] = loop.time() - started
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 1
        server.abort()
        await sim.stop()
    await client.close()
    blocks_s = 2000 // 16 * 16 * 128 * 1024 * 8 / 1e9  # full blocks only: 2.08 s at 1 Gb/s
    assert blocks_s <= waited[1.0] < blocks_s + 1.0
    assert waited[200.0] < 0.5


async def test_a_priority_needs_the_priority_scheduling_policy(worker: Worker) -> None:
    status, body = await worker.call(b"POST", b"/v1/chat/completions", {**CHAT, "priority": 2})
    assert status == 400
    error = json.loads(body)["error"]
    assert "Priority scheduling is not enabled" in error["message"]
    assert error["param"] == "priority"
    loop = asyncio.get_running_loop()
    spec = SimSpec(model="m", profile="h100-llama3-8b", scheduling_policy="priority")
    sim = SimWorker(spec, random.Random(7), loop)
    server = await sim.start("127.0.0.1", 0)
    ranked = Worker(worker.client, Origin.parse(f"http://127.0.0.1:{server.port}"))
    try:
        status, body = await ranked.call(b"POST", b"/v1/chat/completions", {**CHAT, "priority": 2})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 6
    finally:
        server.abort()
        await sim.stop()
