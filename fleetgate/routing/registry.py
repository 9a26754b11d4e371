"""Routing plugins by type name: how config turns `policy: least_requests`, or a composed
`routing:` section, into a pipeline.

Each plugin type is registered with its parameters struct (a Settings subclass, `NoParams` for
one that takes none) and a builder. A config's parameters decode into that struct, where they
are checked; an unknown key or a failed check is a ValueError naming the key. What is not a
parameter (the random source, how old an engine reading may be, the stores of routing state
they read and write) comes from the PluginContext.

The registry is an ordinary object built by the composition root (`default_registry()`), not a
process-wide table: a test or an embedder can build its own with extra plugins.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec

from fleetgate.fleet.load_board import LoadBoard
from fleetgate.routing.base import Filter, Picker, Scorer
from fleetgate.routing.kv_cache import KvCacheScorer
from fleetgate.routing.least_requests import LeastRequests
from fleetgate.routing.least_response_time import LeastResponseTime
from fleetgate.routing.length_split import LengthSplit, LengthSplitParams
from fleetgate.routing.load import STALE_AFTER_S, CandidateLoads
from fleetgate.routing.locality import NOWHERE, Locality, LocalityParams, Place
from fleetgate.routing.long_to_fast import LongToFast, LongToFastParams
from fleetgate.routing.max_score import MaxScore
from fleetgate.routing.pipeline import SHORTLIST, RoutingPipeline
from fleetgate.routing.power_of_two import PowerOfTwo
from fleetgate.routing.prefill_queue import PrefillQueue
from fleetgate.routing.prefix_cache import PrefixCacheParams, PrefixCacheScorer
from fleetgate.routing.prefix_index import MemoryPrefixIndex, entries_for
from fleetgate.routing.queue import QueueScorer
from fleetgate.routing.random_pick import RandomPick
from fleetgate.routing.round_robin import RoundRobin
from fleetgate.routing.session_affinity import SessionAffinity, SessionAffinityParams
from fleetgate.routing.session_table import MemorySessionTable
from fleetgate.routing.slo_aware import NO_OBJECTIVES, Objectives, SloScorer, SloScorerParams
from fleetgate.routing.stores import EngineBlocks, PrefixIndexFactory, SessionTable
from fleetgate.routing.weighted_round_robin import WeightedRoundRobin
from fleetgate.routing.work_share import WorkShare, WorkShareParams
from fleetgate.settings import Settings

T = TypeVar("T")
P = TypeVar("P", bound=Settings)

DEFAULT_POLICY = "balanced"  # a pool's routing when its config names none: the benchmarks' best


@dataclass(frozen=True, slots=True)
class PluginContext:
    """What a plugin may be given when it is built: one per pipeline (so per pool), made by
    the composition root (fleetgate/serve.py), its stores the pool's."""

    rng: random.Random  # its own random source
    board: LoadBoard  # the pool's in-flight counts by backend id (its Pool's: `pool.board`)
    stale_after_s: float = STALE_AFTER_S  # engine readings older than this are not trusted
    # The pool's prefix index, made by the prefix_cache scorer at the size its `memory_mb`
    # allows (in this process's memory by default).
    prefix_index: PrefixIndexFactory = MemoryPrefixIndex
    # The pool's session table (routing/stores.py; in this process's memory by default).
    sessions: SessionTable = field(default_factory=MemorySessionTable)
    # What the pool's engines report holding (kv_events/): None when none publishes.
    engine_blocks: EngineBlocks | None = None
    # Where the gateway runs (routing/locality.py): its region and zone, when it knows them.
    here: Place = NOWHERE
    # The pool's latency objectives (`pools[].slo`), for the plugins that route for them.
    objectives: Objectives = NO_OBJECTIVES
    # The board's records of a candidate set, shared by the pipeline's plugins.
    loads: CandidateLoads = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "loads", CandidateLoads(self.board))


class NoParams(Settings, frozen=True):
    """The parameters of a plugin that takes none: any key is refused."""


@dataclass(frozen=True, slots=True)
class PluginFactory(Generic[P, T]):
    """How one plugin type is built: its config parameters decode into `params`, then
    `build(params, ctx)` makes the plugin."""

    params: type[P]
    build: Callable[[P, PluginContext], T]

    def __call__(self, name: str, raw: Mapping[str, Any], ctx: PluginContext) -> T:
        return self.build(_decode(name, self.params, raw), ctx)


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
        self._pickers: dict[str, PluginFactory[Any, Picker]] = {}
        self._scorers: dict[str, PluginFactory[Any, Scorer]] = {}
        self._filters: dict[str, PluginFactory[Any, Filter]] = {}
        self._profiles: dict[str, Profile] = {}

    def add_picker(
        self, name: str, params: type[P], build: Callable[[P, PluginContext], Picker]
    ) -> None:
        _add(self._pickers, "picker", name, PluginFactory(params, build))

    def add_scorer(
        self, name: str, params: type[P], build: Callable[[P, PluginContext], Scorer]
    ) -> None:
        _add(self._scorers, "scorer", name, PluginFactory(params, build))

    def add_filter(
        self, name: str, params: type[P], build: Callable[[P, PluginContext], Filter]
    ) -> None:
        _add(self._filters, "filter", name, PluginFactory(params, build))

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
        return RoutingPipeline(factory(policy, params, ctx), _placed([], ctx))

    def build_profile(self, profile: Profile, ctx: PluginContext) -> RoutingPipeline:
        filters = [_build(self._filters, "filter", spec, ctx) for spec in profile.filters]
        filters = _placed(filters, ctx)
        scorers = []
        for spec, weight in profile.scorers:
            if not weight > 0:
                raise ValueError(f"scorer {spec.type!r}: weight must be > 0, got {weight}")
            scorers.append((_build(self._scorers, "scorer", spec, ctx), weight))
        picker = _build(self._pickers, "picker", PluginSpec(profile.picker), ctx)
        return RoutingPipeline(picker, filters, scorers, shortlist=profile.shortlist, rng=ctx.rng)


def _placed(filters: list[Any], ctx: PluginContext) -> list[Any]:
    """A gateway that knows its region routes every pool by locality, first: `filters` with
    a default `locality` filter before them unless they have one."""
    if ctx.here.region is None or any(isinstance(f, Locality) for f in filters):
        return filters
    return [Locality(LocalityParams(), ctx.here, ctx.rng, ctx.loads), *filters]


def _add(table: dict[str, T], kind: str, name: str, factory: T) -> None:
    if name in table:
        raise ValueError(f"{kind} {name!r} is already registered")
    table[name] = factory


def _build(
    table: Mapping[str, PluginFactory[Any, T]], kind: str, spec: PluginSpec, ctx: PluginContext
) -> T:
    factory = table.get(spec.type)
    if factory is None:
        known = ", ".join(sorted(table))
        raise UnknownPlugin(f"unknown {kind} {spec.type!r}; known {kind}s: {known}")
    return factory(spec.type, spec.params, ctx)


_UNKNOWN_KEY = re.compile(r"Object contains unknown field `(.*)`")
_AT_KEY = re.compile(r"(.*) - at `\$\.(.*)`")


def _decode(name: str, params: type[P], raw: Mapping[str, Any]) -> P:
    """Plugin `name`'s parameters from a config's mapping; a ValueError names the key."""
    try:
        return msgspec.convert(dict(raw), params)
    except msgspec.ValidationError as exc:
        message = str(exc)  # raised below, outside the handler: msgspec's trace adds nothing
    unknown = _UNKNOWN_KEY.fullmatch(message)
    if unknown:
        takes = ", ".join(sorted(params.__struct_fields__)) or "none"
        raise ValueError(f"unknown parameter {unknown[1]!r}; {name} takes: {takes}")
    wrong = _AT_KEY.fullmatch(message)  # a wrong type: "Expected `int`, got `str` - at `$.x`"
    if wrong:
        message = f"`{wrong[2]}`: {wrong[1][:1].lower()}{wrong[1][1:]}"
    raise ValueError(f"{name}: {message}")  # a failed check names its field itself


def _seeded(plugin: Callable[[random.Random], T]) -> Callable[[NoParams, PluginContext], T]:
    """A builder of a parameterless plugin that draws from the context's random source."""
    return lambda _, ctx: plugin(ctx.rng)


def _loaded(
    plugin: Callable[[random.Random, CandidateLoads], T],
) -> Callable[[NoParams, PluginContext], T]:
    """A builder of a parameterless picker that draws from the context's random source and
    reads the load board."""
    return lambda _, ctx: plugin(ctx.rng, ctx.loads)


def _reading(
    plugin: Callable[[CandidateLoads, float], T],
) -> Callable[[NoParams, PluginContext], T]:
    """A builder of a parameterless plugin that reads the load board, and engine metrics up to
    the context's age."""
    return lambda _, ctx: plugin(ctx.loads, ctx.stale_after_s)


def default_registry() -> PluginRegistry:
    """Every plugin fleetgate ships."""
    registry = PluginRegistry()
    pickers: tuple[tuple[str, Callable[[random.Random], Picker]], ...] = (
        ("round_robin", RoundRobin), ("weighted_round_robin", WeightedRoundRobin),
        ("random", RandomPick), ("max_score", MaxScore),
    )  # fmt: skip
    for name, picker in pickers:
        registry.add_picker(name, NoParams, _seeded(picker))
    registry.add_picker("least_requests", NoParams, _loaded(LeastRequests))
    registry.add_picker("power_of_two", NoParams, _loaded(PowerOfTwo))
    registry.add_scorer("queue", NoParams, _reading(QueueScorer))
    registry.add_scorer("kv_cache", NoParams, _reading(KvCacheScorer))
    registry.add_scorer("least_response_time", NoParams, _reading(LeastResponseTime))
    registry.add_scorer(
        "prefix_cache",
        PrefixCacheParams,
        lambda params, ctx: PrefixCacheScorer(
            ctx.loads,
            params,
            index=ctx.prefix_index(entries_for(params.memory_mb)),
            engine_blocks=ctx.engine_blocks,
            stale_after_s=ctx.stale_after_s,
        ),
    )
    registry.add_scorer(
        "session_affinity",
        SessionAffinityParams,
        lambda params, ctx: SessionAffinity(ctx.loads, params, sessions=ctx.sessions),
    )
    registry.add_scorer("prefill_queue", NoParams, lambda _, ctx: PrefillQueue(ctx.loads))
    registry.add_scorer("work_share", WorkShareParams, lambda params, _: WorkShare(params))
    registry.add_scorer(
        "slo", SloScorerParams, lambda params, ctx: SloScorer(ctx.loads, params, ctx.objectives)
    )
    registry.add_filter("length_split", LengthSplitParams, lambda params, _: LengthSplit(params))
    registry.add_filter(
        "locality",
        LocalityParams,
        lambda params, ctx: Locality(params, ctx.here, ctx.rng, ctx.loads),
    )
    registry.add_filter(
        "long_to_fast",
        LongToFastParams,
        lambda params, ctx: LongToFast(ctx.loads, params, rng=ctx.rng),
    )
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
