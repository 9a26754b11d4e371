"""Routing plugins by type name: how config turns `policy: least_requests`, or a composed
`routing:` section, into a pipeline.

The registry is an ordinary object built by the composition root (`default_registry()`), not a
process-wide table: a test or an embedder can build its own with extra plugins.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fleetgate.routing.base import Filter, Picker, Scorer
from fleetgate.routing.kv_cache import KvCacheScorer
from fleetgate.routing.least_requests import LeastRequests
from fleetgate.routing.least_response_time import LeastResponseTime
from fleetgate.routing.length_split import LengthSplit
from fleetgate.routing.load import STALE_AFTER_S
from fleetgate.routing.long_to_fast import LongToFast
from fleetgate.routing.max_score import MaxScore
from fleetgate.routing.pipeline import SHORTLIST, RoutingPipeline
from fleetgate.routing.power_of_two import PowerOfTwo
from fleetgate.routing.prefill_queue import PrefillQueue
from fleetgate.routing.prefix_cache import PrefixCacheScorer
from fleetgate.routing.queue import QueueScorer
from fleetgate.routing.random_pick import RandomPick
from fleetgate.routing.round_robin import RoundRobin
from fleetgate.routing.session_affinity import SessionAffinity
from fleetgate.routing.weighted_round_robin import WeightedRoundRobin
from fleetgate.routing.work_share import WorkShare

T = TypeVar("T")

DEFAULT_POLICY = "balanced"  # a pool's routing when its config names none: the benchmarks' best


@dataclass(frozen=True, slots=True)
class PluginContext:
    """What a plugin may be given when it is built."""

    rng: random.Random  # its own random source
    stale_after_s: float = STALE_AFTER_S  # engine readings older than this are not trusted


PickerFactory = Callable[[Mapping[str, Any], PluginContext], Picker]
ScorerFactory = Callable[[Mapping[str, Any], PluginContext], Scorer]
FilterFactory = Callable[[Mapping[str, Any], PluginContext], Filter]


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """One plugin of a pipeline: its type name and parameters."""

    type: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Profile:
    """A routing profile: filters, weighted scorers and the picker that reads their scores."""

    scorers: tuple[tuple[PluginSpec, float], ...]
    picker: str = "max_score"
    filters: tuple[PluginSpec, ...] = ()
    shortlist: int = SHORTLIST

    @staticmethod
    def of(*scorers: tuple[str, float], filters: tuple[str, ...] = ()) -> Profile:
        """A profile of parameterless plugins, e.g. Profile.of(("queue", 1), ("kv_cache", 1))."""
        return Profile(
            tuple((PluginSpec(name), weight) for name, weight in scorers),
            filters=tuple(PluginSpec(name) for name in filters),
        )


class UnknownPlugin(ValueError):
    """A config names a plugin type that is not registered."""


class PluginRegistry:
    """Factories keyed by type name, and named profiles."""

    def __init__(self) -> None:
        self._pickers: dict[str, PickerFactory] = {}
        self._scorers: dict[str, ScorerFactory] = {}
        self._filters: dict[str, FilterFactory] = {}
        self._profiles: dict[str, Profile] = {}

    def add_picker(self, name: str, factory: PickerFactory) -> None:
        _add(self._pickers, "picker", name, factory)

    def add_scorer(self, name: str, factory: ScorerFactory) -> None:
        _add(self._scorers, "scorer", name, factory)

    def add_filter(self, name: str, factory: FilterFactory) -> None:
        _add(self._filters, "filter", name, factory)

    def add_profile(self, name: str, profile: Profile) -> None:
        if name in self._profiles or name in self._pickers:
            raise ValueError(f"policy {name!r} is already registered")
        self._profiles[name] = profile

    @property
    def policy_names(self) -> list[str]:
        """What `policy:` and `--policy` accept: every picker and every named profile."""
        return sorted([*self._pickers, *self._profiles])

    @property
    def picker_names(self) -> list[str]:
        return sorted(self._pickers)

    @property
    def scorer_names(self) -> list[str]:
        return sorted(self._scorers)

    @property
    def filter_names(self) -> list[str]:
        return sorted(self._filters)

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
        filters = [_build(self._filters, "filter", spec, ctx) for spec in profile.filters]
        scorers = []
        for spec, weight in profile.scorers:
            if not weight > 0:
                raise ValueError(f"scorer {spec.type!r}: weight must be > 0, got {weight}")
            scorers.append((_build(self._scorers, "scorer", spec, ctx), weight))
        picker = _build(self._pickers, "picker", PluginSpec(profile.picker), ctx)
        return RoutingPipeline(picker, filters, scorers, shortlist=profile.shortlist, rng=ctx.rng)


def _add(table: dict[str, T], kind: str, name: str, factory: T) -> None:
    if name in table:
        raise ValueError(f"{kind} {name!r} is already registered")
    table[name] = factory


def _build(
    table: Mapping[str, Callable[[Mapping[str, Any], PluginContext], T]],
    kind: str,
    spec: PluginSpec,
    ctx: PluginContext,
) -> T:
    factory = table.get(spec.type)
    if factory is None:
        known = ", ".join(sorted(table))
        raise UnknownPlugin(f"unknown {kind} {spec.type!r}; known {kind}s: {known}")
    return factory(spec.params, ctx)


def from_params(
    cls: Callable[..., T], **injected: Any
) -> Callable[[Mapping[str, Any], PluginContext], T]:
    """A factory that passes config parameters to `cls` by name, refusing any it does not
    take, plus `injected` context values (by attribute name of PluginContext) it does take."""
    accepted = set(inspect.signature(cls).parameters)

    def build(params: Mapping[str, Any], ctx: PluginContext) -> T:
        unknown = sorted(set(params) - accepted - set(injected))
        if unknown:
            takes = ", ".join(sorted(accepted - set(injected))) or "none"
            raise ValueError(f"unknown parameter {unknown[0]!r}; it takes: {takes}")
        extra = {k: getattr(ctx, v) for k, v in injected.items() if k in accepted}
        try:
            return cls(**params, **extra)
        except TypeError as exc:
            raise ValueError(str(exc)) from None

    return build


def default_registry() -> PluginRegistry:
    """Every plugin fleetgate ships."""
    registry = PluginRegistry()
    for name, picker in (
        ("round_robin", RoundRobin), ("weighted_round_robin", WeightedRoundRobin),
        ("random", RandomPick), ("least_requests", LeastRequests),
        ("power_of_two", PowerOfTwo), ("max_score", MaxScore),
    ):  # fmt: skip
        registry.add_picker(name, from_params(picker, rng="rng"))
    stale = {"stale_after_s": "stale_after_s"}
    registry.add_scorer("queue", from_params(QueueScorer, **stale))
    registry.add_scorer("kv_cache", from_params(KvCacheScorer, **stale))
    registry.add_scorer("least_response_time", from_params(LeastResponseTime, **stale))
    registry.add_scorer("prefix_cache", from_params(PrefixCacheScorer, **stale))
    registry.add_scorer("session_affinity", from_params(SessionAffinity))
    registry.add_scorer("prefill_queue", from_params(PrefillQueue))
    registry.add_scorer("work_share", from_params(WorkShare))
    registry.add_filter("length_split", from_params(LengthSplit))
    registry.add_filter("long_to_fast", from_params(LongToFast, rng="rng"))
    registry.add_profile("least_loaded", Profile.of(("queue", 1), ("kv_cache", 1)))
    registry.add_profile("least_response_time", Profile.of(("least_response_time", 1)))
    registry.add_profile(
        "prefix_cache", Profile.of(("prefix_cache", 3), ("queue", 2), ("kv_cache", 2))
    )
    registry.add_profile("session_affinity", Profile.of(("session_affinity", 10), ("queue", 1)))
    registry.add_profile(
        "balanced",
        Profile.of(
            ("prefix_cache", 3), ("queue", 2), ("prefill_queue", 2), ("work_share", 2),
            ("kv_cache", 1), filters=("long_to_fast",),
        ),
    )  # fmt: skip
    return registry
