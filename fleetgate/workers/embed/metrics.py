"""The embed worker's /metrics, named in vLLM's style under `fleetgate_embed:`: the queue and
the running batch as gauges read from the batcher, batch sizes and times, request latency,
requests by outcome and prompt tokens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetgate.workers.embed.batcher import Batcher, BatchRun

_LABELS = ["model_name"]
OUTCOMES = ("success", "invalid", "queue_full", "queue_timeout", "error")
_BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)  # fmt: skip


class _QueueCollector(Collector):
    def __init__(self, batcher: Batcher[Any, Any], model: str) -> None:
        self._batcher = batcher
        self._labels = [model]

    def collect(self) -> Iterator[Metric]:
        b = self._batcher
        for name, doc, value in (
            ("fleetgate_embed:num_requests_waiting",
             "Requests with inputs waiting in the queue.", b.waiting_requests),
            ("fleetgate_embed:num_requests_running",
             "Requests with inputs in the batch the model is running.", b.running_requests),
            ("fleetgate_embed:num_inputs_waiting",
             "Inputs waiting in the queue (its length; max_queue_items bounds it).",
             b.waiting_items),
            ("fleetgate_embed:num_inputs_running",
             "Inputs in the batch the model is running.", b.running_items),
        ):  # fmt: skip
            gauge = GaugeMetricFamily(name, doc, labels=_LABELS)
            gauge.add_metric(self._labels, value)
            yield gauge


class EmbedMetrics:
    def __init__(self, batcher: Batcher[Any, Any], model: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_QueueCollector(batcher, model))
        r = self.registry
        self._batch_size = Histogram(
            "fleetgate_embed:batch_size", "Inputs per model run.", _LABELS,
            buckets=_BATCH_SIZE_BUCKETS, registry=r,
        ).labels(model)  # fmt: skip
        self._batch_s = Histogram(
            "fleetgate_embed:batch_duration_seconds", "Time of one model run.", _LABELS,
            buckets=_SECONDS_BUCKETS, registry=r,
        ).labels(model)  # fmt: skip
        self._queue_s = Histogram(
            "fleetgate_embed:request_queue_time_seconds",
            "Arrival to the request's last input entering a batch.", _LABELS,
            buckets=_SECONDS_BUCKETS, registry=r,
        ).labels(model)  # fmt: skip
        self._e2e_s = Histogram(
            "fleetgate_embed:e2e_request_latency_seconds", "Arrival to answer, for successes.",
            _LABELS, buckets=_SECONDS_BUCKETS, registry=r,
        ).labels(model)  # fmt: skip
        requests = Counter(
            "fleetgate_embed:requests", "Requests answered, by outcome.", [*_LABELS, "outcome"],
            registry=r,
        )  # fmt: skip
        self._outcomes = {o: requests.labels(model, o) for o in OUTCOMES}
        self._tokens = Counter(
            "fleetgate_embed:prompt_tokens", "Tokens embedded.", _LABELS, registry=r
        ).labels(model)

    def batch(self, run: BatchRun) -> None:
        self._batch_size.observe(run.items)
        self._batch_s.observe(run.seconds)
        for waited in run.queue_waits_s:
            self._queue_s.observe(waited)

    def answered(self, outcome: str, seconds: float = 0.0, tokens: int = 0) -> None:
        self._outcomes[outcome].inc()
        if outcome == "success":
            self._e2e_s.observe(seconds)
            self._tokens.inc(tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
