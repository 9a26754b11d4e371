"""The composition root builds each pool's routing from its config, and refuses bad plugins."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from fleetgate.clock import LoopClock
from fleetgate.config import ConfigError, parse_config
from fleetgate.fleet.backend import Backend
from fleetgate.http.client import HttpClient
from fleetgate.resilience.cluster import Cluster
from fleetgate.routing.least_requests import LeastRequests
from fleetgate.routing.max_score import MaxScore
from fleetgate.routing.pipeline import plugin_name
from fleetgate.routing.registry import default_registry
from fleetgate.serve import ResolvedPool, build_clusters


def clusters_for(**pool: Any) -> dict[str, Cluster]:
    config = parse_config({"pools": [{"model": "m", "backends": [{"url": "http://h:1"}], **pool}]})
    backend = Backend("h:1", "http://h:1", ("m",))
    return build_clusters(
        [ResolvedPool(config.pools[0], (backend,))],
        default_registry(),
        random.Random(0),
        transport=HttpClient(),
        clock=LoopClock(),
        subscribe=lambda hooks: None,
    )


def test_the_default_policy_and_a_composed_profile_are_built() -> None:
    default = clusters_for()["m"].router.pipeline
    assert isinstance(default.picker, MaxScore)
    assert [plugin_name(s) for s in default.scorers] == [
        "prefix_cache", "queue", "prefill_queue", "work_share", "kv_cache"
    ]  # fmt: skip
    least = clusters_for(policy="least_requests")["m"].router
    assert isinstance(least.pipeline.picker, LeastRequests)
    assert least.pool.load_changed == least.pipeline.picker.load_changed  # its index is told
    composed = clusters_for(routing={"scorers": [{"type": "prefix_cache", "weight": 3}]})
    assert isinstance(composed["m"].router.pipeline.picker, MaxScore)


@pytest.mark.parametrize(
    ("routing", "expected"),
    [
        ({"scorers": [{"type": "prefix", "weight": 1}]}, "unknown scorer 'prefix'; known"),
        ({"scorers": [{"type": "queue", "weight": 1, "depth": 2}]}, "unknown parameter 'depth'"),
        ({"scorers": [{"type": "prefix_cache", "weight": 1, "memory_mb": -1}]},
         "prefix_cache: `memory_mb` must be a finite number > 0, got -1.0"),
        ({"filters": [{"type": "nope"}], "scorers": [{"type": "queue", "weight": 1}]},
         "unknown filter 'nope'"),
        ({"scorers": [{"type": "queue", "weight": 1}], "picker": "best"}, "unknown picker 'best'"),
    ],
)  # fmt: skip
def test_a_bad_plugin_is_a_config_error_naming_the_pool(routing: Any, expected: str) -> None:
    with pytest.raises(ConfigError, match="pool 'm': .*" + re.escape(expected)):
        clusters_for(routing=routing)
