"""`length_split`: prompts of at least `threshold_tokens` (bytes / 4) go to backends labelled
`length: long`, the others to the rest; with none of the request's class, all stay."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.length_split import LengthSplit, LengthSplitParams
from fleetgate.routing.registry import PluginContext, PluginSpec, Profile, default_registry


def labelled(*labels: dict[str, str]) -> tuple[BackendState, ...]:
    return tuple(
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",), labels=label))
        for i, label in enumerate(labels)
    )


def of_tokens(tokens: int, extra_bytes: int = 0) -> RoutingRequest:
    return RoutingRequest("m", "chat", True, prompt=b"x" * (4 * tokens + extra_bytes))


MIXED = labelled(
    {"length": "long"}, {"length": "long", "zone": "a"}, {}, {"zone": "b"}, {"length": "short"}
)


def test_long_prompts_go_to_long_backends_and_short_ones_to_the_rest() -> None:
    split = LengthSplit(LengthSplitParams(threshold_tokens=100))
    assert list(split.filter(of_tokens(100), MIXED, 0.0)) == list(MIXED[:2])
    assert list(split.filter(of_tokens(5000), MIXED, 0.0)) == list(MIXED[:2])
    assert list(split.filter(of_tokens(99, extra_bytes=3), MIXED, 0.0)) == list(MIXED[2:])
    assert list(split.filter(of_tokens(0), MIXED, 0.0)) == list(MIXED[2:])


def test_without_a_backend_of_the_requests_class_every_candidate_stays() -> None:
    split = LengthSplit(LengthSplitParams(threshold_tokens=100))
    short_only = labelled({}, {"length": "short"})
    assert split.filter(of_tokens(500), short_only, 0.0) is short_only
    long_only = labelled({"length": "long"}, {"length": "long"})
    assert split.filter(of_tokens(10), long_only, 0.0) is long_only
    assert list(split.filter(of_tokens(500), long_only, 0.0)) == list(long_only)


def test_the_label_key_is_configurable() -> None:
    split = LengthSplit(LengthSplitParams(threshold_tokens=10, label="tier"))
    backends = labelled({"tier": "long"}, {"length": "long"})
    assert list(split.filter(of_tokens(10), backends, 0.0)) == [backends[0]]
    assert list(split.filter(of_tokens(9), backends, 0.0)) == [backends[1]]


def test_a_threshold_under_one_token_is_refused() -> None:
    with pytest.raises(ValueError, match="`threshold_tokens` must be >= 1, got 0"):
        LengthSplitParams(threshold_tokens=0)


def test_a_profile_with_the_split_keeps_long_prefills_off_the_short_backends() -> None:
    profile = Profile(
        scorers=((PluginSpec("queue"), 1.0),),
        filters=(PluginSpec("length_split", {"threshold_tokens": 1000}),),
    )
    pipeline = default_registry().build_profile(
        profile, PluginContext(random.Random(2), MemoryLoadBoard())
    )
    long_picks = Counter(pipeline.pick(of_tokens(4000), MIXED, 0.0) for _ in range(50))
    short_picks = Counter(pipeline.pick(of_tokens(50), MIXED, 0.0) for _ in range(60))
    assert set(long_picks) == set(MIXED[:2])
    assert set(short_picks) == set(MIXED[2:])
