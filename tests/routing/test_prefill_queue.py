"""`prefill_queue`: 1 - p_i / max p, p the prompt tokens still waiting for their first token
over the backend's weight."""

from __future__ import annotations

import random

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import CandidateLoads
from fleetgate.routing.prefill_queue import PrefillQueue
from fleetgate.routing.registry import PluginContext, default_registry

REQUEST = RoutingRequest("m", "chat", True, prompt=b"x" * 400)


def states(n: int) -> tuple[BackendState, ...]:
    return tuple(
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",))) for i in range(n)
    )


def test_pending_prompt_tokens_score_against_the_longest_prefill_queue() -> None:
    a, b, c = states(3)
    board = MemoryLoadBoard()
    scorer = PrefillQueue(CandidateLoads(board))
    assert scorer.score(REQUEST, (a, b, c), 0.0) == [1.0, 1.0, 1.0]
    board.begin(a.backend.id, 8000)
    board.begin(b.backend.id, 2000)
    assert scorer.score(REQUEST, (a, b, c), 0.0) == pytest.approx([0.0, 0.75, 1.0])


def test_a_heavier_backend_works_through_its_queue_faster() -> None:
    fast = BackendState(Backend("h100", "http://127.0.0.1:8100", ("m",), weight=2.5))
    slow = BackendState(Backend("a100", "http://127.0.0.1:8101", ("m",)))
    board = MemoryLoadBoard()
    scorer = PrefillQueue(CandidateLoads(board))
    board.begin(fast.backend.id, 5000)  # 2000 a unit of weight each
    board.begin(slow.backend.id, 2000)
    assert scorer.score(REQUEST, (fast, slow), 0.0) == pytest.approx([0.0, 0.0])
    board.begin(slow.backend.id, 2000)
    assert scorer.score(REQUEST, (fast, slow), 0.0) == pytest.approx([0.5, 0.0])


def test_the_balanced_profile_keeps_a_short_prompt_off_a_backend_busy_prefilling() -> None:
    board = MemoryLoadBoard()
    pipeline = default_registry().build_pipeline(
        "balanced", {}, PluginContext(random.Random(3), board)
    )
    prefilling, decoding = states(2)
    board.begin(prefilling.backend.id, 8000)  # one long prompt, no token yet
    for _ in range(2):  # two requests past their prefill
        board.begin(decoding.backend.id, 0)
    assert {pipeline.pick(REQUEST, (prefilling, decoding), 0.0) for _ in range(10)} == {decoding}
