"""How busy backends are, from each engine's last fresh reading and the gateway's own count.

The engine's count includes other clients' requests; the gateway's includes requests sent since
the last scrape. Routing takes the larger, and the gateway's alone once the reading is stale.
Both helpers take a whole candidate list: scorers call them once per pick, not per backend.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState

STALE_AFTER_S = 5.0  # the default age beyond which an engine reading is not trusted


def queue_lengths(
    candidates: Sequence[BackendState], now: float, stale_after_s: float
) -> list[float]:
    """Per backend: max(in flight by the gateway, running + waiting by the engine)."""
    queues: list[float] = []
    oldest = now - stale_after_s
    for state in candidates:
        engine = state.engine
        mine = float(state.in_flight)
        if engine is None or engine.scraped_at < oldest:
            queues.append(mine)
        else:
            theirs = engine.running + engine.waiting
            queues.append(theirs if theirs > mine else mine)
    return queues


def kv_usages(
    candidates: Sequence[BackendState], now: float, stale_after_s: float
) -> list[float | None]:
    """Per backend: its KV-cache use now in [0, 1], or None without a fresh engine reading.

        k_i = kv_read + (t_now - t_read) / capacity
    kv_read: the engine's last reading; t: the gateway's in-flight prompt tokens to it, now and
    when it was read (so the prompts sent since count at once, and those finished since are let
    go); capacity: the engine's KV cache in tokens, when it reports it (else k_i = kv_read).
    """
    oldest = now - stale_after_s
    usages: list[float | None] = []
    for state in candidates:
        engine = state.engine
        if engine is None or engine.scraped_at < oldest:
            usages.append(None)
            continue
        kv = engine.kv_usage
        capacity = engine.kv_capacity_tokens
        if capacity:
            kv += (state.in_flight_tokens - engine.sent_tokens) / capacity
        usages.append(min(1.0, max(0.0, kv)))
    return usages
