"""Where an attempt goes: the router's pick, reported as a Routed event. Every attempt (the
first, a retry, a hedge, a continuation, a prefill) is routed through here."""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.fleet.backend import BackendState
from fleetgate.lifecycle.events import AttemptKind, Routed
from fleetgate.lifecycle.hooks import Emitters
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.router import Router


def routed(
    router: Router,
    emit: Emitters,
    *,
    request_id: bytes,
    model: str,
    routing: RoutingRequest,
    kind: AttemptKind,
    now: float,
    tried: Sequence[BackendState] = (),
) -> BackendState | None:
    """The backend for an attempt of `kind` (one not in `tried`, when some were; a retry or a
    continuation in a region not tried, while one can serve it), or None;
    with Routed and each scorer's say for whoever hears it (only then are they gathered)."""
    why: dict[str, float] | None = {} if emit.routed is not None else None
    if tried:  # after a failure, a region not tried first
        elsewhere = kind == "retry" or kind == "continuation"
        state = router.pick_other(routing, now, tried, why, elsewhere=elsewhere)
    else:
        state = router.pick(routing, now, why)
    if emit.routed is not None and why is not None:
        picked = None if state is None else state.backend.id
        emit.routed(Routed(request_id, now, model, picked, kind, why))
    return state
