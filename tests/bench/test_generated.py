"""Shared-prefix groups and synthetic length distributions."""

from __future__ import annotations

import collections
import itertools
import random
import statistics

import pytest

from fleetgate.bench.generated import LengthDist, SharedPrefixShape, shared_prefix, synthetic
from fleetgate.tokens import count_tokens


def test_shared_prefix_sends_every_group_prompt_once_in_a_seeded_shuffle() -> None:
    shape = SharedPrefixShape(groups=4, prompts_per_group=3, system_prompt_len=20, question_len=5)
    specs = list(shared_prefix(random.Random(1), shape))
    assert len(specs) == 12
    assert collections.Counter(s.group for s in specs) == {0: 3, 1: 3, 2: 3, 3: 3}
    groups = [s.group or 0 for s in specs]
    assert groups != sorted(groups)  # shuffled
    assert specs == list(shared_prefix(random.Random(1), shape))
    for spec in specs:
        system, user = spec.messages
        assert (system.role, user.role) == ("system", "user")
        assert count_tokens(system.content) == 20
        assert count_tokens(user.content) == 5
        assert spec.prompt_tokens == count_tokens(spec.prompt) == 25
        assert spec.max_tokens == shape.output_len
    by_group: dict[int | None, set[str]] = collections.defaultdict(set)
    for spec in specs:
        by_group[spec.group].add(spec.messages[0].content)
    assert all(len(systems) == 1 for systems in by_group.values())
    assert len({next(iter(s)) for s in by_group.values()}) == 4
    assert len({s.messages[1].content for s in specs}) == 12


def test_shared_prefix_defaults_are_sglangs() -> None:
    assert SharedPrefixShape() == SharedPrefixShape(64, 16, 2048, 128, 256)
    with pytest.raises(ValueError, match="groups"):
        SharedPrefixShape(groups=0)


def test_synthetic_lengths_follow_their_distributions() -> None:
    rng = random.Random(2)
    fixed = list(
        itertools.islice(synthetic(rng, input_len=LengthDist(12), output_len=LengthDist(3)), 5)
    )
    assert {(s.prompt_tokens, s.max_tokens) for s in fixed} == {(12, 3)}
    assert all(count_tokens(s.prompt) == 12 for s in fixed)

    uniform = LengthDist(100, "uniform", 0.5)
    draws = [uniform.draw(rng) for _ in range(4000)]
    assert min(draws) >= 50
    assert max(draws) <= 150
    assert statistics.fmean(draws) == pytest.approx(100, rel=0.03)

    exponential = LengthDist(100, "exponential")
    draws = [exponential.draw(rng) for _ in range(4000)]
    assert min(draws) >= 1
    assert statistics.fmean(draws) == pytest.approx(100, rel=0.08)
    assert statistics.stdev(draws) == pytest.approx(100, rel=0.1)


def test_length_dist_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="mean"):
        LengthDist(0)
    with pytest.raises(ValueError, match="range ratio"):
        LengthDist(10, "uniform", 1.0)
