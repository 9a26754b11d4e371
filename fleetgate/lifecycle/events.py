"""What happens to a request, as typed events: the one way the request path reports.

    Received -> Rejected                                    (refused at the edge)
    Received -> Admitted -> Routed -> AttemptStarted -> [FirstToken] -> AttemptEnded
       then, after a failure before the first byte:  Routed -> RetryRefused | Retried -> ...
             a first token late (hedging on):         Routed -> Hedged -> AttemptStarted ...
             a stream broken after it:                Routed -> Continued -> AttemptStarted ...
    ... -> Finished                    (exactly once per request, last; with what it used)

The request path only emits; what the events mean to each part of the gateway is decided by
its subscribers (lifecycle/hooks.py): fleet accounting, the outlier detector, the hedge's TTFT
window, metrics, and later tracing, logs, SLOs and admission. Events are frozen, slotted
msgspec structs (about 50 ns each to make) and are never kept by the path that emits them;
`gc=False` because they hold no cycles and die young. Times are the injected clock's seconds.
A backend is named by its id (fleet/backend.py `backend_id`), never by its live state: a
subscriber that needs the state looks it up in the pool it was given (fleet/pool.py `members`).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from fleetgate.fleet.gpu import GpuState
from fleetgate.routing.base import RoutingRequest

# first: the first try; retry: after a failure; hedge: a second try racing a slow first;
# continuation: the rest of a stream that broke off; prefill: the prefill half of a
# disaggregated request.
AttemptKind = Literal["first", "retry", "hedge", "continuation", "prefill"]
# Why an attempt ended without a whole answer. `cancelled`: the gateway stopped it (the
# client left, or a hedge's other attempt won); `gateway`: the gateway's own code raised;
# `client_timeout`: a timeout the client asked to be shorter than the pool's ran out before
# the pool's own would have; `local_resources`: the gateway could not open a socket (out of
# file descriptors, memory or buffers). None of these is ever the backend's fault.
ErrorKind = Literal[
    "connect", "read", "protocol", "timeout", "cancelled", "gateway", "client_timeout",
    "local_resources",
]  # fmt: skip
NOT_UPSTREAM: frozenset[ErrorKind] = frozenset(
    {"cancelled", "gateway", "client_timeout", "local_resources"}
)
# answered: the client got a backend's answer (whatever its status); failed: the gateway
# answered with an error of its own after its attempts; rejected: refused before routing;
# client_closed: the client left first.
Outcome = Literal["answered", "failed", "rejected", "client_closed"]
CacheResult = Literal["", "miss", "hit", "coalesced"]
# Which outlier rule ejected a backend: failures in a row, the failure rate of an interval,
# or the first failure after its return (half-open).
EjectReason = Literal["consecutive_failures", "failure_rate", "half_open"]
NO_BACKEND = "none"  # Finished.backend of a request the gateway answered itself


class Event(msgspec.Struct, frozen=True, gc=False):
    """Every event names its request and when it happened."""

    request_id: bytes
    at: float


class Received(Event, frozen=True, gc=False):
    """A request arrived at a model endpoint, with the client's W3C `traceparent` header (None
    when it sent none): tracing continues the client's trace."""

    path: bytes
    traceparent: bytes | None = None


class Rejected(Event, frozen=True, gc=False):
    """The gateway refused the request before routing it (bad input, unknown model, a bad
    key, a rate limit or budget, shedding). `reason` is the error's code."""

    status: int
    reason: str
    tenant: str = ""  # whose request, when the gateway knew it ("" before its key was read)
    priority: str = ""  # its class, when the gateway knew it (refused by a limit or shed)


class Admitted(Event, frozen=True, gc=False):
    """The request will be routed in the pool of `model`, `queued_s` after it arrived (its
    wait in the pool's admission queue, and the front door's checks)."""

    model: str
    request: RoutingRequest
    tenant: str = "anonymous"  # whose request (traffic/tenants.py)
    priority: str = "standard"  # its class: critical, standard or sheddable
    queued_s: float = 0.0


class Routed(Event, frozen=True, gc=False):
    """A backend was picked for an attempt (its id; None: no candidate was left). `scores`:
    each scorer's score of it, by plugin name (empty when the pipeline had nothing to
    compare)."""

    model: str
    backend: str | None
    kind: AttemptKind
    scores: dict[str, float]


class AttemptStarted(Event, frozen=True, gc=False):
    """The request was sent to `backend` (its id). `prompt_tokens` (estimated) is what the
    backend must prefill for it; `queued_prefill` the prompt tokens sent there before it and
    not yet prefilled."""

    model: str
    backend: str
    kind: AttemptKind
    prompt_tokens: int
    queued_prefill: int


class FirstToken(Event, frozen=True, gc=False):
    """The first streamed event of an attempt arrived: its `prompt_tokens` are prefilled.
    `ttft_s`: the time from the request's arrival, when this was also the client's first
    token (a hedge that lost the race and a continuation's first event give None); `sent_at`:
    when this attempt was sent (`at - sent_at`: the engine's own time to it); `batch`: the
    request is in the batch lane."""

    model: str
    backend: str
    kind: AttemptKind
    prompt_tokens: int
    ttft_s: float | None
    sent_at: float
    batch: bool = False


class AttemptEnded(Event, frozen=True, gc=False):
    """An attempt is over, however it went: `status` is the backend's HTTP status (0 when none
    came), `error` why it ended without a whole answer (None when it had one). `stream`: the
    answer was relayed as a stream, with its `first_token_at` and `output_tokens` (the
    engine's count when it sent a usage, else estimated from the text: upstream/progress.py;
    never the number of events, which a transport may batch); `sent_at`, `prompt_tokens` and
    `queued_prefill` as its AttemptStarted said. `prior_status`: the last 5xx an earlier
    attempt of the request got (0: none), so that a body every backend refuses alike is seen
    as the request's fault; `prior_backend`: the backend that answer still counts against
    (None when none does, or when an answer like it has already shown it the request's).
    Both backends by id."""

    model: str
    backend: str
    kind: AttemptKind
    sent_at: float
    prompt_tokens: int
    queued_prefill: int
    status: int
    error: ErrorKind | None
    retry_after_s: float | None  # the backend's Retry-After, when it sent one with an error
    first_token_at: float | None
    output_tokens: int
    stream: bool
    prior_status: int = 0
    prior_backend: str | None = None
    priority: int = 1  # the request's class (traffic/priority.py; 1, standard, when unknown)


class Retried(Event, frozen=True, gc=False):
    """The request is tried again, on a backend not tried yet: `status` is what the failed
    attempt got (0 when no answer came)."""

    model: str
    status: int


class RetryRefused(Event, frozen=True, gc=False):
    """A retry was not sent because the pool's retry budget was spent."""

    model: str


class Hedged(Event, frozen=True, gc=False):
    """A second attempt was sent (to `backend`, by id) because the first one's first token
    was late."""

    model: str
    backend: str


class Continued(Event, frozen=True, gc=False):
    """A stream broke off after `tokens` tokens and goes on at `backend` (its id)."""

    model: str
    backend: str
    tokens: int


class Ejected(Event, frozen=True, gc=False):
    """The outlier detector took `backend` (its id) out of routing until `until`, after the
    attempt of `request_id` failed: `reason` is the rule that fired (health/outlier.py)."""

    model: str
    backend: str
    until: float
    reason: EjectReason


class GpuChanged(Event, frozen=True, gc=False):
    """A GPU agent's readings, or their growing too old, changed how the gateway sees
    `backend` (its id; no request: its `request_id` is empty): `state` is the new one,
    `reasons` what made it (e.g. "gpu 3: xid 79"; "no readings for 15.2 s" when stale; empty
    for ok)."""

    model: str
    backend: str
    state: GpuState
    reasons: tuple[str, ...]


class Finished(Event, frozen=True, gc=False):
    """The request is over: every Received request ends with exactly one Finished. `model` is
    the pool's ("" when refused before routing), `backend` the id of the backend whose
    answer the client got ("none" when the gateway answered itself). `output_tokens`: a
    stream's output tokens (the engine's usage, else estimated from its text); None for a
    whole answer, whose body the gateway does not decode. A routed request also says whose it was
    (`tenant`, its class `priority`), how long it waited for admission (`queued_s`) and how
    many attempts it took, so that a subscriber needs to keep nothing of it meanwhile. When
    its tokens are counted (traffic/limits.py: a limited tenant's, a priced pool's, any
    stream's), what its tenant is charged for it: `prompt_tokens` and `completion_tokens`
    (the engine's `usage`; a stream's estimated prompt and the tokens relayed) and what that
    costs at the pool's prices (`pools[].pricing`; 0 when it has none). `prompt_tokens` is
    None when it used nothing counted (an error answer) or its use is unknown."""

    model: str
    started: float
    status: int
    backend: str
    outcome: Outcome
    ttft_s: float | None
    output_tokens: int | None
    tenant: str = ""
    priority: str = ""
    queued_s: float | None = None
    attempts: int = 0
    prompt_tokens: int | None = None  # None: not counted (then the rest are 0)
    completion_tokens: int = 0
    cost_usd: float = 0.0
    # The response cache's part (director/cache.py): "" for a request it does not keep,
    # "miss" (a backend answered), "hit" or "coalesced" (an identical request's answer).
    cache: CacheResult = ""
