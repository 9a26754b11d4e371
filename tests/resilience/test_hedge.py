"""Hedging's pieces: the TTFT window's delay and the race for the client."""

from __future__ import annotations

import asyncio
import random

from fleetgate.resilience.hedge import HedgeSettings, Race, TtftWindow


def test_the_delay_is_the_percentile_of_recent_ttfts_within_bounds() -> None:
    settings = HedgeSettings(percentile=0.9, min_delay_s=0.01, max_delay_s=1.0, window=100)
    window = TtftWindow(settings)
    assert settings.delay_s(window) == 1.0  # no data yet: the longest wait
    rng = random.Random(1)
    for _ in range(320):
        window.add(rng.uniform(0.0, 0.2))
    assert 0.16 < settings.delay_s(window) < 0.2  # about the 90th percentile of U(0, 0.2)
    for _ in range(320):
        window.add(5.0)  # old samples roll out; the cap holds
    assert settings.delay_s(window) == 1.0


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
