"""Several simulations at once, each in its own process: a run is single-threaded (one
virtual-time loop), so a comparison or a capacity search runs as many at a time as there are
cores.

A scenario crosses to its worker as builtins (msgspec.to_builtins) and is rebuilt and checked
there, so the call is plain data whatever the start method; its Outcome comes back pickled.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import msgspec

from fleetgate.bench.stats import Summary
from fleetgate.simulate.run import Outcome, simulate
from fleetgate.simulate.scenario import Scenario, parse_scenario

# A run's summaries by title, "all clients" first (command.report): what the callers make of
# the outcomes, given to them by the command.
Report = Callable[[Scenario, Outcome], dict[str, Summary]]


def simulate_all(scenarios: Sequence[Scenario]) -> list[Outcome]:
    """Each scenario's outcome, in order, run in at most os.cpu_count() processes."""
    if not scenarios:
        return []
    workers = min(len(scenarios), os.cpu_count() or 1)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(simulate_builtins, [msgspec.to_builtins(s) for s in scenarios]))


def simulate_builtins(data: Any) -> Outcome:
    """One run in a worker process, its scenario given as builtins."""
    return simulate(parse_scenario(data))
