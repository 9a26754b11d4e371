"""Routing plugins by type name: how config turns `policy: least_requests` into objects.

The registry is an ordinary object built by the composition root (`default_registry()`), not a
process-wide table: a test or an embedder can build its own with extra plugins.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fleetgate.routing.base import Picker
from fleetgate.routing.least_requests import LeastRequests
from fleetgate.routing.pipeline import RoutingPipeline
from fleetgate.routing.power_of_two import PowerOfTwo
from fleetgate.routing.random_pick import RandomPick
from fleetgate.routing.round_robin import RoundRobin
from fleetgate.routing.weighted_round_robin import WeightedRoundRobin


@dataclass(frozen=True, slots=True)
class PluginContext:
    """What a plugin may be given when it is built: its own random source."""

    rng: random.Random


PickerFactory = Callable[[Mapping[str, Any], PluginContext], Picker]


class UnknownPlugin(ValueError):
    """A config names a plugin type that is not registered."""


class PluginRegistry:
    """Factories keyed by type name."""

    def __init__(self) -> None:
        self._pickers: dict[str, PickerFactory] = {}

    def add_picker(self, name: str, factory: PickerFactory) -> None:
        if name in self._pickers:
            raise ValueError(f"picker {name!r} is already registered")
        self._pickers[name] = factory

    @property
    def picker_names(self) -> list[str]:
        return sorted(self._pickers)

    def build_pipeline(
        self, policy: str, params: Mapping[str, Any], ctx: PluginContext
    ) -> RoutingPipeline:
        factory = self._pickers.get(policy)
        if factory is None:
            known = ", ".join(self.picker_names)
            raise UnknownPlugin(f"unknown routing policy {policy!r}; known policies: {known}")
        return RoutingPipeline(factory(params, ctx))


def _no_params(cls: Callable[[random.Random], Picker]) -> PickerFactory:
    def build(params: Mapping[str, Any], ctx: PluginContext) -> Picker:
        if params:
            raise ValueError(f"this policy takes no parameters, got: {', '.join(params)}")
        return cls(ctx.rng)

    return build


def default_registry() -> PluginRegistry:
    """Every plugin fleetgate ships."""
    registry = PluginRegistry()
    registry.add_picker("round_robin", _no_params(RoundRobin))
    registry.add_picker("weighted_round_robin", _no_params(WeightedRoundRobin))
    registry.add_picker("random", _no_params(RandomPick))
    registry.add_picker("least_requests", _no_params(LeastRequests))
    registry.add_picker("power_of_two", _no_params(PowerOfTwo))
    return registry
