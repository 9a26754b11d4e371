"""What a parsed request passes before routing: its tenant's limits (traffic/door.py), then its
pool's admission queue (traffic/admission.py); and what it gives back when it ends.

Headers a client may send here (each may only lower what its tenant is allowed):
    x-fleetgate-priority          critical | standard | sheddable
    x-fleetgate-lane              batch: use only the pool's spare capacity
    x-fleetgate-queue-timeout-s   the longest wait for admission, at most the tenant's
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from fleetgate.lifecycle.events import Charged
from fleetgate.lifecycle.hooks import Emitters
from fleetgate.traffic.admission import Admission, Shed, Ticket
from fleetgate.traffic.door import Caller, FrontDoor, Refused, retry_after
from fleetgate.traffic.limits import FREE, PricingSettings, Reservation
from fleetgate.traffic.priority import Priority
from fleetgate.upstream.attempt import Exchange

LANE_HEADER = b"x-fleetgate-lane"
QUEUE_TIMEOUT_HEADER = b"x-fleetgate-queue-timeout-s"
PRIORITY_HEADER = b"x-fleetgate-priority"


@dataclass(slots=True)
class Entry:
    """An admitted request's holds, given back by `Entrance.leave`."""

    tenant: str
    priority: Priority
    held: Reservation | None  # of its tenant's limits (None: no limits to reconcile)
    ticket: Ticket | None  # its place in the pool (None: the pool admits without a queue)
    admission: Admission | None


class Entrance:
    def __init__(
        self,
        door: FrontDoor | None,
        clock: Callable[[], float],
        emit: Emitters,
        pricing: Mapping[str, PricingSettings] | None = None,
        assumed_output_tokens: int = 256,
    ) -> None:
        self._door = door
        self._clock = clock
        self._emit = emit  # for Charged
        self._pricing = {m: p for m, p in (pricing or {}).items() if p != FREE}
        self._assumed = assumed_output_tokens

    async def enter(
        self,
        caller: Caller,
        ex: Exchange,
        headers: dict[bytes, bytes],
        admission: Admission | None,
    ) -> Entry:
        """The request's holds, or `Refused` (429 over a limit, 503 shed, 400 bad header)."""
        tenant = caller.tenant
        try:
            priority = tenant.priority_for(headers.get(PRIORITY_HEADER))
        except ValueError as exc:
            raise Refused(400, f"x-fleetgate-priority: {exc}.", "invalid_priority") from None
        routing = ex.routing
        held = None
        if self._door is not None and tenant.limited:
            held = await self._door.enter(
                caller, priority, ex.model, routing.prompt_tokens, routing.max_tokens
            )
            ex.count_usage = held.counts_tokens
            ex.reply_headers = tuple(held.headers)
        if ex.model in self._pricing:
            ex.count_usage = True  # its spend is counted
        if admission is None:
            return Entry(tenant.name, priority, held, None, None)
        settings = tenant.settings
        lane = headers.get(LANE_HEADER)
        cost = routing.prompt_tokens + (routing.max_tokens or self._assumed)
        ticket = Ticket(
            tenant.name, priority, settings.batch or lane == b"batch", cost, settings.weight,
            ex.started + _queue_timeout(headers, settings.queue_timeout_s),
        )  # fmt: skip
        if not admission.admit_now(ticket):
            try:
                await admission.wait(ticket)
            except BaseException as exc:  # shed, or the client left: nothing was used
                if held is not None:
                    refund = self._release_limits(held, 0, 0)
                    if refund is not None:
                        await refund
                if isinstance(exc, Shed):
                    wait = [retry_after(exc.retry_after_s)]
                    raise Refused(
                        exc.status, exc.message, exc.code, wait, priority=priority
                    ) from None
                raise
        return Entry(tenant.name, priority, held, ticket, admission)

    def leave(self, entry: Entry, ex: Exchange) -> Awaitable[None] | None:
        """Give back the request's place, say what it used (Charged), and reconcile its
        limits with it."""
        if entry.ticket is not None and entry.admission is not None:
            entry.admission.leave(entry.ticket)
        used = _used(ex)
        if used is None:
            return None
        prompt, output = used
        charged = self._emit.charged
        if charged is not None and (prompt or output):
            pricing = self._pricing.get(ex.model, FREE)
            charged(
                Charged(
                    ex.request_id, self._clock(), ex.model, entry.tenant, prompt, output,
                    pricing.cost_usd(prompt, output),
                )
            )  # fmt: skip
        if entry.held is None:
            return None
        return self._release_limits(entry.held, prompt, output)

    def _release_limits(
        self, held: Reservation, prompt: int, output: int
    ) -> Awaitable[None] | None:
        assert self._door is not None
        return self._door.leave(held, prompt, output)


def _queue_timeout(headers: dict[bytes, bytes], tenants: float) -> float:
    value = headers.get(QUEUE_TIMEOUT_HEADER)
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


def _used(ex: Exchange) -> tuple[int, int] | None:
    """The prompt and completion tokens a request used, for its tenant's limits: the engine's
    `usage` when the answer had one; for a stream, the estimated prompt and the events relayed
    (one per token); nothing for an error the client got instead of an answer; None (keep
    what was reserved) for an answer whose use is unknown."""
    if ex.usage is not None:
        return ex.usage.prompt_tokens, ex.usage.completion_tokens
    if ex.progress is not None:
        return ex.routing.prompt_tokens, ex.progress.events
    if ex.writer.status == 200:
        return None
    return 0, 0
