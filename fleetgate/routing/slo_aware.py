"""`slo` scorer: prefers the backend where this request spends the least of its time-to-first-
token objective (T) and its prefill takes the least of the time-per-output-token objective (I)
of the answers already streaming there: goodput counts both, not the first token alone.

A prompt's prefill shares the engine's steps with the answers decoding there (chunked prefill):
each of them waits for it, so a long prompt placed where many answers stream stretches all
their times per token. For a request of P prompt tokens on backend i:

    s_i      seconds of prefill per prompt token, measured (fleet/latency.py: time to first
             token over the prompt tokens the backend had to prefill, this one's and those
             queued before it); the least known among the candidates where none is yet
    q_i      prompt tokens sent there and not yet prefilled (the pool's load board)
    d_i      answers streaming there: the requests in flight less those waiting for their
             prefill, counted as their prompt tokens are: d_i = n_i * (1 - q_i / t_i)
             (n_i requests in flight, t_i their prompt tokens)
    L        the answer's length: max_tokens, else the backend's recent mean

    ttft_i   = s_i * (q_i + P)                  this request's first token
    delta_i  = s_i * P / max(1, L - 1)          what its prefill adds to each answer's mean
                                                time per token there (one of its L - 1
                                                gaps carries the P tokens)
    cost_i   = ttft_i / T  +  d_i * delta_i / I     the objectives' budgets it spends
    score_i  = min_j cost_j / cost_i            (1 for the cheapest; all 1 while nothing
                                                is measured)

Only T / I matters to the choice: it prices a second of one answer's first token against a
second added to the time per token of answers streaming. T and I are the pool's objectives
(`pools[].slo.ttft_s`, `tpot_s`) unless the scorer's parameters give them.

Measured alone in virtual time (benchmarks/virtual_routing.py, 8 simulated H100s, 3 seeds),
against least_requests: on code-completion at 22 and 30 req/s TTFT p90 0.90x / 0.99x, TPOT
p90 1.04x / 0.92x, goodput (TTFT <= 2 s and TPOT <= 200 ms) 1.00x / 1.02x, with the first
token due in 1 s 1.04x / 1.07x; on azure-conv at 32 req/s worse (TTFT p99 1.74x, TPOT p90
1.44x: it does not see that a step reading more answers' KV is slower), and on 4 H100s with
4 A100s too (goodput 0.93x at 26 req/s: it does not keep long prompts off the slow GPUs). So
it is a scorer to compose, not a profile. O(n) over the candidates it is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.least_response_time import DEFAULT_OUTPUT_TOKENS, best_known
from fleetgate.routing.load import CandidateLoads
from fleetgate.settings import Settings, positive_seconds

DEFAULT_TTFT_S, DEFAULT_TPOT_S = 2.0, 0.2  # without objectives: DistServe's chat SLO's ratio


@dataclass(frozen=True, slots=True)
class Objectives:
    """A pool's latency objectives routing may aim at (`pools[].slo`); None: not set."""

    ttft_s: float | None = None
    tpot_s: float | None = None


NO_OBJECTIVES = Objectives()


class SloScorerParams(Settings, frozen=True):
    """The `slo` scorer's parameters: the objectives to price, when not the pool's."""

    ttft_s: float | None = None  # time to first token (default: the pool's slo.ttft_s, or 2)
    tpot_s: float | None = None  # time per output token (the pool's slo.tpot_s, or 0.2)

    def __post_init__(self) -> None:
        for name, value in (("ttft_s", self.ttft_s), ("tpot_s", self.tpot_s)):
            if value is not None:
                positive_seconds(name, value)


class SloScorer:
    name = "slo"

    def __init__(
        self,
        loads: CandidateLoads,
        params: SloScorerParams | None = None,
        objectives: Objectives | None = None,
    ) -> None:
        self._loads = loads
        params, objectives = params or SloScorerParams(), objectives or NO_OBJECTIVES
        self._ttft = params.ttft_s or objectives.ttft_s or DEFAULT_TTFT_S
        self._tpot = params.tpot_s or objectives.tpot_s or DEFAULT_TPOT_S

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        prefill = best_known([s.latency.prefill_s_per_token for s in candidates])
        prompt = request.prompt_tokens
        per_ttft, per_tpot = 1.0 / self._ttft, 1.0 / self._tpot
        costs: list[float] = []
        for (state, load), s in zip(self._loads.of(candidates), prefill, strict=True):
            out = request.max_tokens or state.latency.output_tokens or DEFAULT_OUTPUT_TOKENS
            tokens = load.in_flight_tokens
            streaming = (
                max(0.0, load.in_flight * (1.0 - load.pending_prefill / tokens)) if tokens else 0.0
            )
            ttft = s * (load.pending_prefill + prompt)
            delta = s * prompt / max(1.0, out - 1.0)
            costs.append(ttft * per_ttft + streaming * delta * per_tpot)
        best = min(costs)
        if best <= 0.0:  # nothing measured anywhere: every cost is 0
            return [1.0 if c <= 0.0 else 0.0 for c in costs]
        return [best / c for c in costs]
