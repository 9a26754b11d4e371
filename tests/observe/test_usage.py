"""Tenants' use (observe/usage.py), fed the events a request's way makes."""

from __future__ import annotations

from fleetgate.lifecycle.events import Admitted, Finished
from fleetgate.lifecycle.hooks import Emitters, Hooks
from fleetgate.observe.usage import TenantUsage, TenantUse
from fleetgate.routing.base import RoutingRequest


def admitted(tenant: str) -> Admitted:
    return Admitted(b"r", 100.0, "m", RoutingRequest("m", "chat", False), tenant, "critical")


def finished(model: str, tenant: str, prompt: int | None, completion: int, cost: float) -> Finished:
    return Finished(b"r", 101.0, model, 100.0, 200, "b", "answered", None, None, tenant,
                    "critical", 0.0, 1, prompt, completion, cost)  # fmt: skip


def test_each_tenant_counts_its_admitted_requests_tokens_and_spend() -> None:
    usage = TenantUsage(["gold", "idle"])
    hooks = Hooks()
    usage.subscribe(hooks)
    emit = Emitters(hooks)
    assert emit.admitted is not None and emit.finished is not None
    for tenant in ("gold", "gold", "anonymous"):
        emit.admitted(admitted(tenant))
    emit.finished(finished("m", "gold", 10, 5, 0.25))
    emit.finished(finished("m2", "gold", 3, 2, 0.5))
    emit.finished(finished("m", "anonymous", None, 0, 0.0))  # an error answer: nothing counted
    assert usage.tenants() == [
        TenantUse("anonymous", 1),
        TenantUse("gold", 2, 13, 7, 0.75),
        TenantUse("idle"),  # known from the config, at zero until it calls
    ]
