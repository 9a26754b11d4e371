"""A closed-loop concurrency sweep in virtual time, like NIM's benchmark harness.

`concurrency` clients each send a request, wait for its last token, and send the next one after
a short turnaround (`client_delay_s`: the HTTP round trip; a request that arrives mid-step
waits for the step to end, as on a real server). Every prompt is distinct (no shared prefix),
every request generates exactly `output_tokens`. The first clients start at random times over
one estimated request lifetime, so they do not move in lockstep, and the first
`warmup_requests` are left out of the figures: only steady state is measured, as NIM does.
Time is virtual: nothing sleeps, and a run costs only the engine's Python steps.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from fleetgate.workers.sim.engine import Engine, EngineRequest
from fleetgate.workers.sim.profiles import EngineProfile
from fleetgate.workers.sim.prompt import synthetic


@dataclass(frozen=True, slots=True)
class SweepResult:
    """Steady-state figures of one sweep point, in NIM's terms."""

    concurrency: int
    num_requests: int
    """Requests measured (after warm-up)."""
    mean_ttft_s: float
    """Mean time from a request's arrival to its first token."""
    mean_itl_s: float
    """Mean over requests of the mean gap between consecutive tokens (genai-perf's ITL)."""
    output_tokens_per_s: float
    """Long-run output rate: concurrency * output_tokens / mean (lifetime + turnaround)."""
    mean_running: float
    """Sequences running (admitted, not queued), time-averaged over the measured window."""
    num_preemptions: int
    """Preemptions during the measured window."""
    window_s: float
    """Virtual seconds measured."""


def run_concurrency_sweep(
    profile: EngineProfile,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    *,
    num_requests: int | None = None,
    warmup_requests: int | None = None,
    client_delay_s: float = 0.002,
    seed: int = 0,
) -> SweepResult:
    """Keep `concurrency` requests in flight and measure `num_requests` of them.

    Defaults: `num_requests` = max(2 * concurrency, 4); `warmup_requests` = concurrency.
    """
    if concurrency < 1 or output_tokens < 2:
        raise ValueError("need concurrency >= 1 and output_tokens >= 2 (ITL needs two tokens)")
    measured = max(2 * concurrency, 4) if num_requests is None else num_requests
    if measured < 1:
        raise ValueError("num_requests must be >= 1")
    first_measured = concurrency if warmup_requests is None else warmup_requests
    last_measured = first_measured + measured
    rng = random.Random(seed)
    engine = Engine(profile)
    bs = profile.block_size

    arrivals: list[tuple[float, int]] = []  # (time, request index), a heap
    lifetime = _estimated_lifetime(profile, concurrency, prompt_tokens, output_tokens)
    for index in range(concurrency):
        start = rng.uniform(0.0, lifetime) if index else 0.0
        heapq.heappush(arrivals, (start, index))
    issued = concurrency

    ttfts: list[float] = []
    itls: list[float] = []
    lifetimes = 0.0
    window_start = -1.0
    preemptions_at_start = 0
    running_time = 0.0  # integral of sequences running over the window
    t = 0.0
    while len(ttfts) < measured:
        while arrivals and arrivals[0][0] <= t:
            at, index = heapq.heappop(arrivals)
            if index == first_measured:
                window_start = at
                preemptions_at_start = engine.stats().num_preemptions_total
            engine.add_request(
                EngineRequest(f"r{index}", synthetic(prompt_tokens, bs, index), output_tokens, at)
            )
        if not engine.has_work():
            t = arrivals[0][0]
            continue
        running = engine.num_running
        result = engine.step(t)
        t += result.duration_s
        if window_start >= 0:
            running_time += running * result.duration_s
        for done in result.finished:
            if first_measured <= int(done.request_id[1:]) < last_measured:
                ttfts.append(done.first_token_s - done.arrival_s)
                itls.append((done.finish_s - done.first_token_s) / (done.output_tokens - 1))
                lifetimes += done.finish_s - done.arrival_s
            heapq.heappush(arrivals, (t + client_delay_s, issued))
            issued += 1

    # Each client completes one request per lifetime plus turnaround (Little's law), which is
    # the long-run rate; a window's token count would depend on where it cuts the load cycles.
    cycle_s = lifetimes / measured + client_delay_s
    return SweepResult(
        concurrency=concurrency,
        num_requests=measured,
        mean_ttft_s=sum(ttfts) / measured,
        mean_itl_s=sum(itls) / measured,
        output_tokens_per_s=concurrency * output_tokens / cycle_s,
        mean_running=running_time / (t - window_start),
        num_preemptions=engine.stats().num_preemptions_total - preemptions_at_start,
        window_s=t - window_start,
    )


def _estimated_lifetime(
    profile: EngineProfile, concurrency: int, prompt_tokens: int, output_tokens: int
) -> float:
    """A rough request lifetime at this load, to spread the first arrivals over."""
    context = prompt_tokens + output_tokens // 2
    running = min(concurrency, profile.kv_capacity_tokens // context, profile.max_num_seqs)
    prefill = profile.step_time(prompt_tokens, prompt_tokens)
    decode = profile.step_time(running, running * context)
    return prefill + output_tokens * decode
