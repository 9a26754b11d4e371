"""A benchmark run's settings, validated once, and the workload they describe."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from fleetgate.bench.generated import LengthDist, SharedPrefixShape, shared_prefix, synthetic
from fleetgate.bench.stats import Slo
from fleetgate.bench.traces import TRACE_SOURCES, azure_conv, mooncake_conv, trace_file
from fleetgate.bench.workloads import (
    Arrivals,
    Bursts,
    Endpoint,
    PoissonArrivals,
    RequestSpec,
    TraceTimes,
    bounded,
    schedule,
)

# "trace" is a user's own file (--trace FILE), not one of --workload's choices.
WorkloadName = Literal[
    "azure-conv", "mooncake-conv", "shared-prefix", "synthetic", "code-completion", "trace"
]
WORKLOADS: tuple[WorkloadName, ...] = (
    "azure-conv", "mooncake-conv", "shared-prefix", "synthetic", "code-completion"
)  # fmt: skip
TRACE_WORKLOADS: tuple[WorkloadName, ...] = ("azure-conv", "mooncake-conv", "trace")
DEFAULT_RATE = 10.0  # req/s for generated workloads, which have no times of their own
# code-completion: synthetic requests shaped as an editor's completions (long prompts of the
# code around the cursor, short answers), sent in bursts (Bursts' defaults: 8 requests on
# average over 1 s), each prompt fresh (no prefix shared). Lengths uniform in mean * [0.5, 1.5].
SYNTHETIC_INPUT, SYNTHETIC_OUTPUT = LengthDist(1024), LengthDist(128)
COMPLETION_INPUT = LengthDist(2000, "uniform", 0.5)
COMPLETION_OUTPUT = LengthDist(30, "uniform", 0.5)


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Everything that decides what a run sends, and how; written into summary.json."""

    target: str  # the server's base URL
    workload: WorkloadName = "azure-conv"
    # Trace workloads default to their own times; generated ones to DEFAULT_RATE.
    arrivals: Arrivals | None = None
    duration_s: float = 60.0
    max_requests: int | None = None
    seed: int = 0
    model: str | None = None  # None: the first model the server lists
    endpoint: Endpoint = "chat"
    stream: bool = True
    grace_s: float = 30.0
    slo: Slo = field(default_factory=Slo)
    shared_prefix: SharedPrefixShape = field(default_factory=SharedPrefixShape)
    # synthetic and code-completion: None is the workload's default (SYNTHETIC_*, COMPLETION_*)
    input_len: LengthDist | None = None
    output_len: LengthDist | None = None
    trace_file: Path | None = None  # workload "trace": the file it replays

    def __post_init__(self) -> None:
        if self.workload not in (*WORKLOADS, "trace"):
            raise ValueError(f"unknown workload {self.workload!r}; one of {', '.join(WORKLOADS)}")
        if (self.workload == "trace") != (self.trace_file is not None):
            raise ValueError("a trace file is replayed as workload 'trace', and only then")
        if isinstance(self.arrivals, TraceTimes) and self.workload not in TRACE_WORKLOADS:
            raise ValueError(f"--trace-speed needs a trace workload; {self.workload} has no times")
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ValueError(
                f"duration must be a positive number of seconds, not {self.duration_s}"
            )
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max requests must be at least 1, not {self.max_requests}")
        if self.grace_s < 0:
            raise ValueError(f"grace period must not be negative, not {self.grace_s}")

    @property
    def effective_arrivals(self) -> Arrivals:
        if self.arrivals is not None:
            return self.arrivals
        if self.workload in TRACE_WORKLOADS:
            return TraceTimes()
        if self.workload == "code-completion":
            return Bursts(DEFAULT_RATE)
        return PoissonArrivals(DEFAULT_RATE)

    def to_json(self) -> dict[str, Any]:
        """The config as JSON-ready values (an infinite rate is written as "inf")."""
        doc = asdict(self)
        arrivals = self.effective_arrivals
        if isinstance(arrivals, TraceTimes):
            doc["arrivals"] = {"kind": "trace", "speed": arrivals.speed}
        elif isinstance(arrivals, Bursts):
            doc["arrivals"] = {"kind": "bursts", "rate": arrivals.rate, "size": arrivals.size,
                               "spread_s": arrivals.spread_s}  # fmt: skip
        else:
            rate = "inf" if math.isinf(arrivals.rate) else arrivals.rate
            doc["arrivals"] = {"kind": "poisson", "rate": rate}
        if self.workload in TRACE_SOURCES:
            doc["trace_source"] = TRACE_SOURCES[self.workload]
        if self.trace_file is not None:
            doc["trace_file"] = str(self.trace_file)
        return doc


def default_lengths(workload: WorkloadName) -> tuple[LengthDist, LengthDist]:
    """A generated workload's prompt and answer lengths when no flag changes them."""
    if workload == "code-completion":
        return COMPLETION_INPUT, COMPLETION_OUTPUT
    return SYNTHETIC_INPUT, SYNTHETIC_OUTPUT


def build_workload(config: BenchConfig, rng: random.Random) -> Iterator[RequestSpec]:
    """The run's requests, lazily, with send times set and bounded by duration and count."""
    specs: Iterator[RequestSpec]
    if config.workload == "azure-conv":
        specs = azure_conv(rng, endpoint=config.endpoint)
    elif config.workload == "mooncake-conv":
        specs = mooncake_conv(rng, endpoint=config.endpoint)
    elif config.trace_file is not None:
        specs = trace_file(config.trace_file, rng, endpoint=config.endpoint)
    elif config.workload == "shared-prefix":
        specs = shared_prefix(rng, config.shared_prefix, endpoint=config.endpoint)
    else:
        inputs, outputs = default_lengths(config.workload)
        specs = synthetic(
            rng,
            input_len=config.input_len or inputs,
            output_len=config.output_len or outputs,
            endpoint=config.endpoint,
        )
    timed = schedule(specs, config.effective_arrivals, rng)
    return bounded(timed, config.duration_s, config.max_requests)
