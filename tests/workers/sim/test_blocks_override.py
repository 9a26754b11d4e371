"""`--num-gpu-blocks-override`: the sim engine's KV cache as given, not as its profile says."""

from __future__ import annotations

import asyncio
import random

from fleetgate.workers.sim.spec import SimSpec
from fleetgate.workers.sim.worker import SimWorker


async def test_a_smaller_cache_replaces_the_profiles() -> None:
    worker = SimWorker(
        SimSpec("m", "h100-llama3-8b", num_gpu_blocks=100), random.Random(1),
        asyncio.get_running_loop(),
    )  # fmt: skip
    assert worker.profile.num_gpu_blocks == 100
    assert worker.profile.kv_capacity_tokens == 1600
    assert worker.engine.profile is worker.profile  # what the engine allocates from
    assert worker.profile.name == "h100-llama3-8b"  # the rest of the profile as it was
