"""The plugin registry: config names become pipelines; bad names and params are clear errors."""

from __future__ import annotations

import random
import re

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.routing.base import Picker, RoutingRequest
from fleetgate.routing.least_requests import LeastRequests
from fleetgate.routing.max_score import MaxScore
from fleetgate.routing.pipeline import RoutingPipeline
from fleetgate.routing.power_of_two import PowerOfTwo
from fleetgate.routing.random_pick import RandomPick
from fleetgate.routing.registry import (
    PluginContext,
    PluginRegistry,
    PluginSpec,
    Profile,
    UnknownPlugin,
    default_registry,
)
from fleetgate.routing.round_robin import RoundRobin
from fleetgate.routing.weighted_round_robin import WeightedRoundRobin
from fleetgate.settings import Settings, at_least

CTX = PluginContext(random.Random(0), MemoryLoadBoard())
SHIPPED = {
    "least_requests": LeastRequests,
    "max_score": MaxScore,
    "power_of_two": PowerOfTwo,
    "random": RandomPick,
    "round_robin": RoundRobin,
    "weighted_round_robin": WeightedRoundRobin,
}


def test_every_shipped_policy_is_registered_by_its_config_name() -> None:
    registry = default_registry()
    assert registry.picker_names == sorted(SHIPPED)
    for name, cls in SHIPPED.items():
        pipeline = registry.build_pipeline(name, {}, CTX)
        assert isinstance(pipeline, RoutingPipeline)
        assert type(pipeline.picker) is cls


def test_an_unknown_policy_names_itself_and_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPlugin) as info:
        default_registry().build_pipeline("least_request", {}, CTX)
    message = str(info.value)
    assert "'least_request'" in message
    profiles = [
        "balanced",
        "least_loaded",
        "least_response_time",
        "prefix_cache",
        "session_affinity",
    ]
    assert "known policies: " + ", ".join(sorted([*SHIPPED, *profiles])) in message
    assert isinstance(info.value, ValueError)  # what the composition root turns into ConfigError


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_params_to_a_policy_without_params_are_rejected_by_name(name: str) -> None:
    with pytest.raises(ValueError, match=f"unknown parameter 'choices'; {name} takes: none"):
        default_registry().build_pipeline(name, {"choices": 3, "seed": 1}, CTX)


def test_the_picker_draws_from_the_context_random_source() -> None:
    candidates = tuple(
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",))) for i in range(8)
    )
    request = RoutingRequest("m", "chat", stream=False)

    def picks(seed: int) -> list[BackendState | None]:
        ctx = PluginContext(random.Random(seed), MemoryLoadBoard())
        pipeline = default_registry().build_pipeline("random", {}, ctx)
        return [pipeline.pick(request, candidates, 0.0) for _ in range(20)]

    assert picks(3) == picks(3)
    assert picks(3) != picks(4)


class ChoicesParams(Settings, frozen=True):
    choices: int = 2

    def __post_init__(self) -> None:
        at_least("choices", self.choices, 2)


def test_a_registry_of_ones_own_takes_extra_pickers_once() -> None:
    built: list[ChoicesParams] = []

    def factory(params: ChoicesParams, ctx: PluginContext) -> Picker:
        built.append(params)
        return PowerOfTwo(ctx.rng, ctx.loads)

    registry = PluginRegistry()
    registry.add_picker("p2_with_params", ChoicesParams, factory)
    pipeline = registry.build_pipeline("p2_with_params", {"choices": 3}, CTX)
    assert isinstance(pipeline.picker, PowerOfTwo)
    assert built == [ChoicesParams(choices=3)]
    assert registry.picker_names == ["p2_with_params"]
    with pytest.raises(ValueError, match="p2_with_params: `choices` must be >= 2, got 1"):
        registry.build_pipeline("p2_with_params", {"choices": 1}, CTX)
    with pytest.raises(ValueError, match="unknown parameter 'seed'; p2_with_params takes: choices"):
        registry.build_pipeline("p2_with_params", {"seed": 1}, CTX)
    with pytest.raises(ValueError, match="already registered"):
        registry.add_picker("p2_with_params", ChoicesParams, factory)
    with pytest.raises(UnknownPlugin, match="known policies: p2_with_params"):
        registry.build_pipeline("round_robin", {}, CTX)


@pytest.mark.parametrize(
    ("filters", "scorer", "expected"),
    [
        ([PluginSpec("long_to_fast", {"share": 1.5})], PluginSpec("queue"),
         "long_to_fast: `share` must be in (0, 1], got 1.5"),
        ([], PluginSpec("prefix_cache", {"block_bytes": "128"}),
         "prefix_cache: `block_bytes`: expected `int`, got `str`"),
        ([], PluginSpec("prefix_cache", {"depth": 2}),
         "unknown parameter 'depth'; prefix_cache takes: balance_abs, balance_rel, block_bytes, "
         "max_nominees, memory_mb"),
        ([], PluginSpec("queue", {"stale_after_s": 1.0}),  # context, not a parameter
         "unknown parameter 'stale_after_s'; queue takes: none"),
        ([PluginSpec("long_to_fast", {"rng": 1})], PluginSpec("queue"),
         "unknown parameter 'rng'; long_to_fast takes: share, slack_tokens, threshold_tokens"),
    ],
)  # fmt: skip
def test_a_composed_profiles_bad_parameter_is_refused_by_name(
    filters: list[PluginSpec], scorer: PluginSpec, expected: str
) -> None:
    profile = Profile(((scorer, 1.0),), filters=tuple(filters))
    with pytest.raises(ValueError, match=re.escape(expected)):
        default_registry().build_profile(profile, CTX)
