"""Hedging's pieces: the TTFT window's delay and the race for the client."""

from __future__ import annotations

import asyncio
import random

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.lifecycle.events import FirstToken
from fleetgate.resilience.hedge import HedgeSettings, Race, TtftWindow


def test_the_delay_is_the_percentile_of_recent_ttfts_within_bounds() -> None:
    settings = HedgeSettings(percentile=0.9, min_delay_s=0.01, max_delay_s=1.0, window=100)
    window = TtftWindow(settings)
    assert window.delay_s == 1.0  # no data yet: the longest wait
    rng = random.Random(1)
    for _ in range(320):
        window.add(rng.uniform(0.0, 0.2))
    assert 0.16 < window.delay_s < 0.2  # about the 90th percentile of U(0, 0.2)
    for _ in range(320):
        window.add(5.0)  # old samples roll out; the cap holds
    assert window.delay_s == 1.0


def first_token(ttft_s: float | None) -> FirstToken:
    backend = BackendState(Backend("b0", "http://127.0.0.1:9000", ("m",)))
    return FirstToken(b"r", 1.0, "m", backend, "first", prompt_tokens=1, ttft_s=ttft_s, sent_at=1.0)


def test_the_window_takes_the_clients_first_tokens_and_ignores_those_without_a_ttft() -> None:
    settings = HedgeSettings(percentile=0.5, min_delay_s=0.01, max_delay_s=1.0, window=100)
    window = TtftWindow(settings)
    for _ in range(100):  # a lost hedge or a continuation: not a client's TTFT
        window.on_first_token(first_token(None))
    assert window.delay_s == 1.0  # still no data
    for _ in range(20):
        window.on_first_token(first_token(0.3))
    assert window.delay_s == 0.3  # had the None events counted, this would not hold


async def test_the_first_claim_wins_and_cancels_the_others() -> None:
    race = Race()
    never = asyncio.Event()
    tasks = [asyncio.create_task(never.wait()) for _ in range(2)]
    race.tasks.extend(tasks)  # type: ignore[arg-type]
    claim_a, claim_b = race.claimer(0), race.claimer(1)
    assert claim_b()
    assert claim_b()  # still its own
    assert not claim_a()
    await asyncio.sleep(0)
    assert tasks[0].cancelled()
    assert not tasks[1].done()
    tasks[1].cancel()
