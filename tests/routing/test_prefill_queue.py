"""`prefill_queue`: 1 - p_i / max p, p the prompt tokens still waiting for their first token
over the backend's weight."""

from __future__ import annotations

import random

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.prefill_queue import PrefillQueue
from fleetgate.routing.registry import PluginContext, default_registry

REQUEST = RoutingRequest("m", "chat", True, prompt=b"x" * 400)


def states(n: int) -> tuple[BackendState, ...]:
    return tuple(
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",))) for i in range(n)
    )


def test_pending_prompt_tokens_score_against_the_longest_prefill_queue() -> None:
    a, b, c = states(3)
    assert PrefillQueue().score(REQUEST, (a, b, c), 0.0) == [1.0, 1.0, 1.0]
    a.pending_prefill, b.pending_prefill = 8000, 2000
    assert PrefillQueue().score(REQUEST, (a, b, c), 0.0) == pytest.approx([0.0, 0.75, 1.0])


def test_a_heavier_backend_works_through_its_queue_faster() -> None:
    fast = BackendState(Backend("h100", "http://127.0.0.1:8100", ("m",), weight=2.5))
    slow = BackendState(Backend("a100", "http://127.0.0.1:8101", ("m",)))
    fast.pending_prefill, slow.pending_prefill = 5000, 2000  # 2000 a unit of weight each
    assert PrefillQueue().score(REQUEST, (fast, slow), 0.0) == pytest.approx([0.0, 0.0])
    slow.pending_prefill = 4000
    assert PrefillQueue().score(REQUEST, (fast, slow), 0.0) == pytest.approx([0.5, 0.0])


def test_the_balanced_profile_keeps_a_short_prompt_off_a_backend_busy_prefilling() -> None:
    pipeline = default_registry().build_pipeline("balanced", {}, PluginContext(random.Random(3)))
    prefilling, decoding = states(2)
    prefilling.in_flight, prefilling.pending_prefill = 1, 8000  # one long prompt, no token yet
    decoding.in_flight = 2  # two requests past their prefill
    assert {pipeline.pick(REQUEST, (prefilling, decoding), 0.0) for _ in range(10)} == {decoding}
