"""Model-level routing: aliases, weighted splits (sticky per session) and cheap/strong tiers."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.models import TIER_HEADER, Alias, LengthKeywords, Split, Tiers


def asking(prompt: str, session: str | None = None) -> RoutingRequest:
    return RoutingRequest("m", "chat", False, session_key=session, prompt=prompt.encode())


def test_an_alias_always_names_its_pool() -> None:
    assert Alias("llama").target(asking("hi"), {}) == "llama"


def test_a_split_shares_requests_by_weight() -> None:
    split = Split([("stable", 90.0), ("canary", 10.0)], random.Random(5))
    shares = Counter(split.target(asking("hi"), {}) for _ in range(10_000))
    assert shares["canary"] == pytest.approx(1_000, abs=150)
    assert set(shares) == {"stable", "canary"}


def test_a_session_stays_on_one_side_of_a_split_and_sessions_share_by_weight() -> None:
    split = Split([("blue", 1.0), ("green", 1.0)], random.Random(1))
    for user in ("alice", "bob", "carol"):
        assert len({split.target(asking("hi", user), {}) for _ in range(20)}) == 1
    sides = Counter(split.target(asking("hi", f"user-{i}"), {}) for i in range(4_000))
    assert sides["green"] == pytest.approx(2_000, abs=200)


def test_a_split_needs_positive_weights() -> None:
    with pytest.raises(ValueError, match="weight > 0"):
        Split([("a", 0.0)], random.Random(0))


def test_long_or_keyword_prompts_are_hard_and_go_to_the_strong_tier() -> None:
    tiers = Tiers("small", "big", LengthKeywords(max_prompt_tokens=100, keywords=["Prove"]))
    assert tiers.target(asking("What is the capital of France?"), {}) == "small"
    assert tiers.target(asking("x" * 400), {}) == "big"  # 400 bytes: 100 tokens
    assert tiers.target(asking("please PROVE that 2 is prime"), {}) == "big"


def test_the_tier_header_overrides_the_classifier() -> None:
    tiers = Tiers("small", "big", LengthKeywords(max_prompt_tokens=100))
    assert tiers.target(asking("hi"), {TIER_HEADER: b"strong"}) == "big"
    assert tiers.target(asking("x" * 4000), {TIER_HEADER: b"cheap"}) == "small"
