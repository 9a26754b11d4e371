"""A Response's follow-up is pinned to the backend that keeps the response."""

from __future__ import annotations

import random

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.pool import Pool
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.registry import PluginContext, default_registry
from fleetgate.routing.router import Router
from fleetgate.routing.stored_responses import StoredResponses


def test_the_oldest_ids_are_forgotten_past_capacity() -> None:
    stored = StoredResponses(capacity=2)
    stored.record("resp_a", "b0", "t")
    stored.record("resp_b", "b1", "t")
    stored.record("resp_a", "b0", "t")  # noted again: the newest now
    stored.record("resp_c", "b1", "t")
    assert (stored.where("resp_a"), stored.where("resp_b"), stored.where("resp_c")) == (
        ("b0", "t"), None, ("b1", "t"),
    )  # fmt: skip
    assert len(stored) == 2


def test_a_pinned_request_goes_to_its_backend_while_it_is_a_candidate() -> None:
    states = [
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{9100 + i}", ("m",))) for i in range(3)
    ]
    pool = Pool("m", states)
    ctx = PluginContext(random.Random(1), pool.board)
    router = Router(pool, default_registry().build_pipeline("round_robin", {}, ctx))
    request = RoutingRequest("m", "responses", False, follows="resp_x")
    request.pinned = "b2"
    assert {router.pick(request, 0.0).backend.id for _ in range(6)} == {"b2"}  # type: ignore[union-attr]
    request.pinned = "gone"  # left the pool: ordinary routing, and the engine's 404
    assert {router.pick(request, 0.0).backend.id for _ in range(6)} == {"b0", "b1", "b2"}  # type: ignore[union-attr]
