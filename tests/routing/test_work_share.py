"""`work_share`: the token work sent to each backend, decayed, over its weight; the least worked
scores 1 and the most 0."""

from __future__ import annotations

import math
import random

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.registry import PluginContext, default_registry
from fleetgate.routing.work_share import WorkShare, WorkShareParams


def _request(prompt_tokens: int, max_tokens: int | None = None) -> RoutingRequest:
    return RoutingRequest("m", "chat", True, max_tokens=max_tokens, prompt=b"x" * 4 * prompt_tokens)


def _state(name: str, weight: float = 1.0) -> BackendState:
    return BackendState(Backend(name, f"http://127.0.0.1:{8100 + len(name)}", ("m",), weight))


def test_no_work_yet_scores_everyone_alike() -> None:
    a, b = _state("a"), _state("bb")
    assert WorkShare().score(_request(100), (a, b), 0.0) == [1.0, 1.0]


def test_the_work_sent_counts_prompt_and_max_tokens_and_scores_against_the_range() -> None:
    a, b, c = _state("a"), _state("bb"), _state("ccc")
    share = WorkShare()
    share.chosen(_request(1000, max_tokens=1000), a, 0.0)  # 2000
    share.chosen(_request(500, max_tokens=500), b, 0.0)  # 1000
    assert share.score(_request(1), (a, b, c), 0.0) == pytest.approx([0.0, 0.5, 1.0])


def test_a_heavier_backend_is_given_work_in_proportion() -> None:
    fast, slow = _state("h100", weight=2.5), _state("a100")
    share = WorkShare()
    share.chosen(_request(2500), fast, 0.0)
    share.chosen(_request(1000), slow, 0.0)
    assert share.score(_request(1), (fast, slow), 0.0) == [1.0, 1.0]  # 1000 per unit each


def test_work_fades_with_the_time_constant() -> None:
    a, b = _state("a"), _state("bb")
    share = WorkShare(WorkShareParams(tau_s=10.0))
    share.chosen(_request(1000), a, 0.0)
    share.chosen(_request(1000), b, 10.0)  # a's 1000 has faded to 1000 / e by now
    share.chosen(_request(1000), a, 10.0)
    assert share.work(a, 10.0) == pytest.approx(1000 * (1 + 1 / math.e))
    assert share.score(_request(1), (a, b), 10.0) == pytest.approx([0.0, 1.0])


def test_picking_by_it_alone_splits_the_work_by_weight() -> None:
    fast, slow = _state("h100", weight=2.5), _state("a100")
    share = WorkShare()
    sent = {fast: 0, slow: 0}
    for i in range(700):
        now = i * 0.01
        request = _request(100 + 50 * (i % 7))
        scores = share.score(request, (fast, slow), now)
        chosen = fast if scores[0] >= scores[1] else slow
        share.chosen(request, chosen, now)
        sent[chosen] += request.prompt_tokens
    assert sent[fast] / sent[slow] == pytest.approx(2.5, rel=0.05)


@pytest.mark.parametrize(
    ("tau_s", "tolerance", "field"), [(0.0, 0.25, "tau_s"), (30.0, -0.1, "tolerance")]
)
def test_bad_parameters_are_refused(tau_s: float, tolerance: float, field: str) -> None:
    with pytest.raises(ValueError, match=f"`{field}` must be"):
        WorkShareParams(tau_s=tau_s, tolerance=tolerance)


def test_a_backend_gone_for_long_is_forgotten() -> None:
    gone, here = _state("gone"), _state("here")
    share = WorkShare(WorkShareParams(tau_s=1.0))
    share.chosen(_request(1000), gone, 0.0)
    for i in range(1024):
        share.chosen(_request(10), here, 100.0 + i)
    assert share.known() == 1


def test_the_balanced_profile_shares_the_work_by_weight_while_long_prompts_go_fast() -> None:
    # A fleet that is not full (every request done before the next): the queue scorers see
    # no difference, long_to_fast sends every long prompt to the H100s, and without a share
    # kept over time the A100s would sit idle. Work per unit of weight comes out even.
    fleet = []
    for i, weight in enumerate((1.0, 1.0, 0.4, 0.4, 0.4, 0.4)):  # calibrated: 2 H100s, 4 A100s
        state = BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",)))
        state.weight = weight
        fleet.append(state)
    ctx = PluginContext(random.Random(5), MemoryLoadBoard())
    pipeline = default_registry().build_pipeline("balanced", {}, ctx)
    work = dict.fromkeys(fleet, 0)
    for i in range(3000):
        tokens = 3000 if i % 10 == 0 else 300
        request = RoutingRequest("m", "chat", True, prompt=f"{i:08d}".encode() * (tokens // 2))
        chosen = pipeline.pick(request, fleet, i * 0.05)
        assert chosen is not None
        if tokens == 3000:
            assert chosen in fleet[:2]
        work[chosen] += request.prompt_tokens
    per_weight = [work[s] / s.weight for s in fleet]
    assert max(per_weight) / min(per_weight) < 1.15


def test_a_gap_narrower_than_the_tolerance_scores_in_proportion() -> None:
    a, b = _state("a"), _state("bb")
    share = WorkShare(WorkShareParams(tolerance=0.25))
    share.chosen(_request(1000), a, 0.0)
    share.chosen(_request(1100), b, 0.0)  # 100 apart; a quarter of the mean is 262.5
    assert share.score(_request(1), (a, b), 0.0) == pytest.approx([1.0, 1.0 - 100 / 262.5])
