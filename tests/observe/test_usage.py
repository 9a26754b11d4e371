"""Tenants' use (observe/usage.py), fed the events a request's way makes."""

from __future__ import annotations

from fleetgate.lifecycle.events import Finished
from fleetgate.lifecycle.hooks import Emitters, Hooks
from fleetgate.observe.usage import TenantUsage, TenantUse


def finished(
    model: str, tenant: str, prompt: int | None, completion: int, cost: float, queued: bool = True
) -> Finished:
    return Finished(
        request_id=b"r", at=101.0, model=model, started=100.0, status=200, backend="b",
        outcome="answered", ttft_s=None, output_tokens=None, tenant=tenant, priority="critical",
        queued_s=0.0 if queued else None, attempts=1, prompt_tokens=prompt,
        completion_tokens=completion, cost_usd=cost,
    )  # fmt: skip


def test_each_tenant_counts_its_admitted_requests_tokens_and_spend() -> None:
    usage = TenantUsage(["gold", "idle"])
    hooks = Hooks()
    usage.subscribe(hooks)
    emit = Emitters(hooks)
    assert emit.finished is not None
    emit.finished(finished("m", "gold", 10, 5, 0.25))
    emit.finished(finished("m2", "gold", 3, 2, 0.5))
    emit.finished(finished("m", "anonymous", None, 0, 0.0))  # an error answer: nothing counted
    emit.finished(finished("m", "gold", None, 0, 0.0, queued=False))  # refused: not admitted
    assert usage.tenants() == [
        TenantUse("anonymous", 1),
        TenantUse("gold", 2, 13, 7, 0.75),
        TenantUse("idle"),  # known from the config, at zero until it calls
    ]
