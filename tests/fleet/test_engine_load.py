"""Reading an engine's load from its metrics text: vLLM's names, SGLang's, and staleness."""

from __future__ import annotations

import pytest

from fleetgate.fleet.engine_load import MetricsFormatError, StepTotals, parse_engine_load

VLLM = """\
# HELP vllm:num_requests_running Requests in the running batch.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.3
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 120.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 400.0
vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 10.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 900.0
vllm:iteration_tokens_total_count{engine="1",model_name="m"} 5.0
vllm:iteration_tokens_total_sum{engine="1",model_name="m"} 100.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 40.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.8
"""

SGLANG = """\
sglang:num_running_reqs{model_name="m"} 7.0
sglang:num_queue_reqs{model_name="m"} 1.0
sglang:token_usage{model_name="m"} 0.75
sglang:cache_hit_rate{model_name="m"} 0.4
sglang:max_total_num_tokens{model_name="m"} 50000
"""


def test_vllm_series_are_summed_and_kv_use_averaged() -> None:
    load = parse_engine_load(VLLM, 10.0)
    assert load is not None
    assert (load.running, load.waiting) == (5.0, 4.0)
    assert load.kv_usage == pytest.approx(0.4)
    assert (load.prefix_hits, load.prefix_queries, load.hit_rate) == (120.0, 400.0, None)
    assert load.kv_capacity_tokens == 16_000
    assert load.step_totals == StepTotals(steps=15, tokens=1000, gaps=40, gap_s=0.8)
    assert load.fresh(14.0, 5.0) is load
    assert load.fresh(15.5, 5.0) is None


def test_sglang_names_are_understood() -> None:
    load = parse_engine_load(SGLANG, 0.0)
    assert load is not None
    assert (load.running, load.waiting, load.kv_usage, load.hit_rate) == (7.0, 1.0, 0.75, 0.4)
    assert load.kv_capacity_tokens == 50_000
    assert load.step_totals is None


def test_a_server_without_engine_metrics_gives_no_reading() -> None:
    assert parse_engine_load("process_cpu_seconds_total 1.0\n", 0.0) is None


def test_garbage_is_a_format_error() -> None:
    with pytest.raises(MetricsFormatError):
        parse_engine_load("vllm:num_requests_running{engine= not prometheus\n", 0.0)
