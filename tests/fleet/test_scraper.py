"""The scraper against a real sim worker on localhost: the engine's load lands in the state."""

from __future__ import annotations

import asyncio
import json
import random

from fleetgate.clock import LoopClock
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.fleet.scraper import MetricsScraper, ScrapeSettings
from fleetgate.http.client import HttpClient, Origin
from fleetgate.workers.sim.spec import SimSpec
from fleetgate.workers.sim.worker import SimWorker


async def test_a_scrape_reads_running_requests_and_kv_use_of_a_sim_worker() -> None:
    loop = asyncio.get_running_loop()
    sim = SimWorker(SimSpec(model="m", profile="h100-llama3-8b"), random.Random(1), loop)
    server = await sim.start("127.0.0.1", 0)
    client = HttpClient()
    state = BackendState(Backend("b", f"http://127.0.0.1:{server.port}", ("m",)))
    scraper = MetricsScraper(client, LoopClock(), random.Random(2))
    board = MemoryLoadBoard()  # the pool's count of what the gateway has in flight
    try:
        assert await scraper.scrape(state, ScrapeSettings(), board)
        assert state.engine is not None
        assert state.engine.running == 0
        body = json.dumps({"model": "m", "prompt": "x " * 500, "max_tokens": 2000}).encode()
        origin = Origin.parse(f"http://127.0.0.1:{server.port}")
        pending = asyncio.create_task(client.request(origin, b"POST", b"/v1/completions", [], body))
        for _ in range(100):  # until the engine has admitted it
            await scraper.scrape(state, ScrapeSettings(), board)
            if state.engine.running == 1:
                break
            await asyncio.sleep(0.01)
        assert state.engine.running == 1
        assert state.engine.kv_usage > 0
        points = state.step_fit.points
        await asyncio.sleep(0.05)  # a few decode steps
        assert await scraper.scrape(state, ScrapeSettings(), board)
        assert state.step_fit.points == points + 1  # the steps since the last scrape, fitted
        board.begin(state.backend.id, 250)  # the gateway's own count, noted beside the reading
        assert await scraper.scrape(state, ScrapeSettings(), board)
        assert state.engine.sent_tokens == 250
        pending.cancel()
        server.abort()
        before = state.engine
        assert not await scraper.scrape(state, ScrapeSettings(), board)  # refused: reading kept
        assert state.engine is before
    finally:
        await client.close()
        server.abort()
        await sim.stop()
