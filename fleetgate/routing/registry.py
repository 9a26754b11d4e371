"""Routing plugins by type name: how config turns `policy: least_requests` into objects.

The registry is an ordinary object built by the composition root (`default_registry()`), not a
process-wide table: a test or an embedder can build its own with extra plugins.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fleetgate.routing.base import Picker, Scorer
from fleetgate.routing.least_loaded import LeastLoaded
from fleetgate.routing.least_requests import LeastRequests
from fleetgate.routing.max_score import MaxScore
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
ScorerFactory = Callable[[Mapping[str, Any], PluginContext], Scorer]


@dataclass(frozen=True, slots=True)
class Profile:
    """A named routing profile: weighted scorers and the picker that reads their scores."""

    scorers: tuple[tuple[str, float], ...]
    picker: str = "max_score"


class UnknownPlugin(ValueError):
    """A config names a plugin type that is not registered."""


class PluginRegistry:
    """Factories keyed by type name."""

    def __init__(self) -> None:
        self._pickers: dict[str, PickerFactory] = {}
        self._scorers: dict[str, ScorerFactory] = {}
        self._profiles: dict[str, Profile] = {}

    def add_scorer(self, name: str, factory: ScorerFactory) -> None:
        if name in self._scorers:
            raise ValueError(f"scorer {name!r} is already registered")
        self._scorers[name] = factory

    def add_profile(self, name: str, profile: Profile) -> None:
        if name in self._profiles or name in self._pickers:
            raise ValueError(f"policy {name!r} is already registered")
        self._profiles[name] = profile

    def add_picker(self, name: str, factory: PickerFactory) -> None:
        if name in self._pickers:
            raise ValueError(f"picker {name!r} is already registered")
        self._pickers[name] = factory

    @property
    def picker_names(self) -> list[str]:
        return sorted(self._pickers)

    @property
    def policy_names(self) -> list[str]:
        """What `policy:` and `--policy` accept: every picker and every named profile."""
        return sorted([*self._pickers, *self._profiles])

    def build_pipeline(
        self, policy: str, params: Mapping[str, Any], ctx: PluginContext
    ) -> RoutingPipeline:
        """A pipeline from a policy name: a picker alone, or a named profile."""
        profile = self._profiles.get(policy)
        if profile is not None:
            if params:
                raise ValueError(f"profile {policy!r} takes no parameters")
            return self.build_profile(profile, ctx)
        factory = self._pickers.get(policy)
        if factory is None:
            known = ", ".join(self.policy_names)
            raise UnknownPlugin(f"unknown routing policy {policy!r}; known policies: {known}")
        return RoutingPipeline(factory(params, ctx))

    def build_profile(self, profile: Profile, ctx: PluginContext) -> RoutingPipeline:
        scorers = []
        for name, weight in profile.scorers:
            factory = self._scorers.get(name)
            if factory is None:
                known = ", ".join(sorted(self._scorers))
                raise UnknownPlugin(f"unknown scorer {name!r}; known scorers: {known}")
            scorers.append((factory({}, ctx), weight))
        picker = self._pickers.get(profile.picker)
        if picker is None:
            raise UnknownPlugin(f"unknown picker {profile.picker!r}")
        return RoutingPipeline(picker({}, ctx), scorers=scorers)


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
    registry.add_picker("max_score", _no_params(MaxScore))
    registry.add_scorer("least_loaded", lambda params, ctx: LeastLoaded(**params))
    registry.add_profile("least_loaded", Profile((("least_loaded", 1.0),)))
    return registry
