"""What an engine says about its own load, read from its Prometheus /metrics: requests running
and waiting, KV-cache use, prefix-cache hits, and (vLLM V1) its steps' sizes and times. vLLM's,
SGLang's, llama.cpp's server's and TGI's names are understood (the last two report no KV use).

A reading is only as good as it is recent: `EngineLoad.fresh(now, stale_after_s)` is None once
the last scrape is older than that, so routing falls back to what the gateway itself sees.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# Sample name -> field, for vLLM (V1 and older) and SGLang. Series with several label sets
# (data-parallel engines) are summed, except KV use, which is averaged.
_GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:token_usage": "kv_usage",
    "llamacpp:requests_processing": "running",
    "llamacpp:requests_deferred": "waiting",
    "tgi_batch_current_size": "running",
    "tgi_queue_size": "waiting",
}
_HITS = "vllm:prefix_cache_hits_total"
_QUERIES = "vllm:prefix_cache_queries_total"
_SGLANG_HIT_RATE = "sglang:cache_hit_rate"
_VLLM_CACHE_INFO = "vllm:cache_config_info"  # labels num_gpu_blocks and block_size
_SGLANG_CAPACITY = "sglang:max_total_num_tokens"
# vLLM V1's per-step histograms, as running totals (fleet/step_fit.py fits speed from them).
_STEP_TOTALS = {
    "vllm:iteration_tokens_total_count": 0,  # steps
    "vllm:iteration_tokens_total_sum": 1,  # tokens computed in them
    "vllm:inter_token_latency_seconds_count": 2,  # gaps between two output tokens
    "vllm:inter_token_latency_seconds_sum": 3,  # their total time
}


@dataclass(frozen=True, slots=True)
class StepTotals:
    """Running totals of an engine's steps since it started."""

    steps: float
    tokens: float
    gaps: float
    gap_s: float


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One scrape of one backend's engine."""

    running: float  # requests in the running batch
    waiting: float  # requests queued in the engine
    kv_usage: float  # 0..1 of the KV cache in use
    prefix_hits: float  # prefix-cache hit tokens so far (vLLM), for hit rates over time
    prefix_queries: float  # prefix-cache looked-up tokens so far (vLLM)
    hit_rate: float | None  # SGLang's own hit rate, when it reports one
    scraped_at: float  # the gateway's clock when it was read
    kv_capacity_tokens: float | None = None  # the KV cache's size in tokens, if reported
    sent_tokens: int = 0  # the gateway's in-flight prompt tokens to it when this was read
    step_totals: StepTotals | None = None  # when the engine reports its steps (vLLM V1)

    def fresh(self, now: float, stale_after_s: float) -> EngineLoad | None:
        return self if now - self.scraped_at <= stale_after_s else None


class MetricsFormatError(ValueError):
    """The text is not Prometheus exposition format."""


def parse_engine_load(text: str, now: float) -> EngineLoad | None:
    """The engine's load from its /metrics text; None if it reports none of the known names."""
    sums = {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}
    kv_series = 0
    seen = False
    hits = queries = 0.0
    hit_rate: float | None = None
    capacity: float | None = None
    totals: list[float] | None = None
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                field = _GAUGES.get(sample.name)
                if field is not None:
                    seen = True
                    sums[field] += sample.value
                    kv_series += field == "kv_usage"
                elif sample.name == _HITS:
                    hits += sample.value
                elif sample.name == _QUERIES:
                    queries += sample.value
                elif sample.name == _SGLANG_HIT_RATE:
                    hit_rate = sample.value
                elif sample.name == _VLLM_CACHE_INFO:
                    capacity = (capacity or 0.0) + _vllm_capacity(sample.labels)
                elif sample.name == _SGLANG_CAPACITY:
                    capacity = (capacity or 0.0) + sample.value
                elif (index := _STEP_TOTALS.get(sample.name)) is not None:
                    totals = totals or [0.0] * len(_STEP_TOTALS)
                    totals[index] += sample.value
    except ValueError as exc:
        raise MetricsFormatError(str(exc)) from None
    if not seen:
        return None
    kv = sums["kv_usage"] / kv_series if kv_series else 0.0
    return EngineLoad(
        running=sums["running"],
        waiting=sums["waiting"],
        kv_usage=kv,
        prefix_hits=hits,
        prefix_queries=queries,
        hit_rate=hit_rate,
        scraped_at=now,
        kv_capacity_tokens=capacity or None,
        step_totals=StepTotals(*totals) if totals else None,
    )


def _vllm_capacity(labels: dict[str, str]) -> float:
    try:
        return float(labels.get("num_gpu_blocks", 0)) * float(labels.get("block_size", 0))
    except ValueError:
        return 0.0
