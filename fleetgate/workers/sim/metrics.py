"""The sim worker's /metrics, under vLLM V1's names, so anything that reads vLLM reads it."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from fleetgate.workers.sim.engine import Engine, FinishedRequest

_LABELS = ["model_name", "engine"]
# vLLM's own bucket bounds for these histograms.
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
_ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class _Counts:
    """A histogram that takes many equal observations at once (a step's inter-token gaps)."""

    def __init__(self, name: str, doc: str, bounds: Sequence[float]) -> None:
        self.name, self.doc, self.bounds = name, doc, bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.total += value * n

    def family(self, labels: list[str]) -> HistogramMetricFamily:
        cumulative, buckets = 0, []
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            cumulative += count
            buckets.append((bound, float(cumulative)))
        family = HistogramMetricFamily(self.name, self.doc, labels=_LABELS)
        family.add_metric(labels, buckets, self.total)
        return family


class _StepCollector(Collector):
    """vLLM V1's per-step histograms: tokens per engine step, and the gap before each decoded
    token (what a fit of step time against step size reads, fleet/calibration.py)."""

    def __init__(self, labels: list[str]) -> None:
        self._labels = labels
        self.tokens = _Counts(
            "vllm:iteration_tokens_total", "Tokens per engine step.", _ITERATION_TOKENS_BUCKETS
        )
        self.gaps = _Counts(
            "vllm:inter_token_latency_seconds", "Time between two output tokens.", _TPOT_BUCKETS
        )
        self.lost_s = 0.0

    def step(self, tokens: int, decodes: int, gap_s: float, lost_s: float) -> None:
        self.tokens.observe(tokens)
        if decodes:
            self.gaps.observe(gap_s, decodes)
        self.lost_s += lost_s

    def collect(self) -> Iterator[Metric]:
        yield self.tokens.family(self._labels)
        yield self.gaps.family(self._labels)
        lost = CounterMetricFamily(
            "fleetgate_sim_lost_seconds",
            "Wall seconds the engine fell behind the modelled GPU (its Python could not keep "
            "up): over a few percent of the time, its timings are not faithful.",
            labels=_LABELS,
        )
        lost.add_metric(self._labels, self.lost_s)
        yield lost


class _EngineCollector(Collector):
    def __init__(self, engine: Engine, labels: list[str], block_size: int, blocks: int) -> None:
        self._engine = engine
        self._labels = labels
        self._info = {"block_size": str(block_size), "num_gpu_blocks": str(blocks)}

    def collect(self) -> Iterator[Metric]:
        s = self._engine.stats()
        labels = self._labels
        for name, doc, value in (
            ("vllm:num_requests_running", "Requests in the running batch.", s.num_running),
            ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.", s.kv_usage),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=_LABELS)
            gauge.add_metric(labels, value)
            yield gauge
        for name, doc, value in (
            (
                "vllm:prefix_cache_queries",
                "Tokens looked up.",
                s.prefix_cache_queries_tokens,
            ),
            ("vllm:prefix_cache_hits", "Prompt tokens found cached.", s.prefix_cache_hits_tokens),
            ("vllm:num_preemptions", "Sequences preempted.", s.num_preemptions_total),
            ("vllm:prompt_tokens", "Prompt tokens processed.", s.prompt_tokens_total),
            ("vllm:generation_tokens", "Tokens generated.", s.generation_tokens_total),
            ("vllm:request_success", "Requests finished.", s.request_success_total),
        ):
            counter = CounterMetricFamily(name, doc, labels=_LABELS)
            counter.add_metric(labels, value)
            yield counter
        info = InfoMetricFamily("vllm:cache_config", "KV-cache configuration.")
        info.add_metric([], self._info)
        yield info


class WorkerMetrics:
    """Histograms recorded as requests finish; gauges and counters read from the engine."""

    def __init__(self, engine: Engine, model: str, block_size: int, num_blocks: int) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = [model, "0"]
        self.registry.register(_EngineCollector(engine, labels, block_size, num_blocks))
        self.steps = _StepCollector(labels)
        self.registry.register(self.steps)
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", _LABELS,
            buckets=_TTFT_BUCKETS, registry=self.registry,
        ).labels(*labels)  # fmt: skip
        self._tpot = Histogram(
            "vllm:time_per_output_token_seconds", "Time per output token after the first.",
            _LABELS, buckets=_TPOT_BUCKETS, registry=self.registry,
        ).labels(*labels)  # fmt: skip
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to last token.", _LABELS,
            buckets=_E2E_BUCKETS, registry=self.registry,
        ).labels(*labels)  # fmt: skip

    def finished(self, info: FinishedRequest) -> None:
        self._ttft.observe(info.first_token_s - info.arrival_s)
        self._e2e.observe(info.finish_s - info.arrival_s)
        if info.output_tokens > 1:
            gap = (info.finish_s - info.first_token_s) / (info.output_tokens - 1)
            self._tpot.observe(gap)

    def render(self) -> bytes:
        return generate_latest(self.registry)
