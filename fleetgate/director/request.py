"""One inference request as the Director takes it: parsed, its caller known, nothing of HTTP
left. The gateway's edge makes it from a client's HTTP request; the batch runner from a line of
a batch; a simulator from a trace.

`metadata` are the request's headers that steer its lifecycle (x-fleetgate-*: the edge passes
no other), by lower-case name (empty for a request that has none). Each may only lower what
the caller's tenant is allowed:

    x-fleetgate-priority              critical | standard | sheddable
    x-fleetgate-lane                  batch: use only the pool's spare capacity
    x-fleetgate-queue-timeout-s       the longest wait for admission, at most the tenant's
    x-fleetgate-first-byte-timeout-s  the pool's upstream timeouts, shortened
    x-fleetgate-idle-timeout-s
    x-fleetgate-total-timeout-s
    x-fleetgate-tier                  which model a tiered alias leads to (routing/models.py)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from fleetgate.routing.base import RoutingRequest
from fleetgate.traffic.door import Caller, Refused
from fleetgate.upstream.timeouts import Timeouts

LANE_HEADER = b"x-fleetgate-lane"
QUEUE_TIMEOUT_HEADER = b"x-fleetgate-queue-timeout-s"
PRIORITY_HEADER = b"x-fleetgate-priority"
# Per-request overrides of the pool's timeouts, in seconds: shorter only. A longer one is
# clamped to the pool's (as proxies treat a client's deadline: it may give up sooner, never
# hold the gateway's connections longer than the operator allows).
TIMEOUT_HEADERS = (
    (b"x-fleetgate-first-byte-timeout-s", "first_byte_s"),
    (b"x-fleetgate-idle-timeout-s", "idle_s"),
    (b"x-fleetgate-total-timeout-s", "total_s"),
)


class InferenceRequest(msgspec.Struct, kw_only=True):
    """A request to a model endpoint, ready for its lifecycle (a struct: made in C)."""

    request_id: bytes
    started: float  # when it arrived (the lifecycle's clock)
    path: bytes  # the model endpoint it goes to upstream, e.g. b"/v1/chat/completions"
    routing: RoutingRequest  # what routing may know of it
    body: bytes  # as it goes upstream (the Director may still rewrite fields of a JSON one)
    caller: Caller
    content_type: bytes = b"application/json"
    upload: bool = False  # a pass-through form upload: its body goes exactly as it came
    metadata: Mapping[bytes, bytes] = msgspec.field(default_factory=dict)
    forwarded: list[tuple[bytes, bytes]] = msgspec.field(default_factory=list)  # passed on
    cache_control: bytes = b""  # the client's Cache-Control (director/cache.py)


def request_timeouts(pool: Timeouts, metadata: Mapping[bytes, bytes]) -> Timeouts:
    """The pool's timeouts, with any the request shortens (`pool` itself when it shortens
    none); `Refused` (400) naming a value that is no number of seconds > 0."""
    if not metadata:  # the common case: no header of the gateway's own
        return pool
    changes: dict[str, float] = {}
    for name, field_name in TIMEOUT_HEADERS:
        value = metadata.get(name)
        if value is None:
            continue
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not 0 < seconds < math.inf:
            header = name.decode()
            raise Refused(400, f"The {header} header must be a number of seconds > 0.",
                          None, param=header)  # fmt: skip
        if seconds < getattr(pool, field_name):
            changes[field_name] = seconds
    if not changes:
        return pool
    return Timeouts(
        changes.get("first_byte_s", pool.first_byte_s),
        changes.get("total_s", pool.total_s),
        changes.get("idle_s", pool.idle_s),
        pool.connect_s,
    )


def queue_timeout(metadata: Mapping[bytes, bytes], tenants: float) -> float:
    """The longest wait for admission: the tenant's, or less if the request asks."""
    value = metadata.get(QUEUE_TIMEOUT_HEADER)
    if value is None:
        return tenants
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:
        raise Refused(
            400, "x-fleetgate-queue-timeout-s must be a number of seconds >= 0.",
            "invalid_queue_timeout", param="x-fleetgate-queue-timeout-s",
        )  # fmt: skip
    return min(seconds, tenants)
