"""What a parsed request passes before routing: its tenant's limits (traffic/door.py), then its
pool's admission queue (traffic/admission.py); and what it gives back when it ends. The
request's metadata may lower its class, put it on the batch lane or shorten its wait
(director/request.py)."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from fleetgate.director.request import (
    LANE_HEADER,
    PRIORITY_HEADER,
    QUEUE_TIMEOUT_HEADER,
    InferenceRequest,
    queue_timeout,
)
from fleetgate.traffic.admission import Admission, Shed, Ticket
from fleetgate.traffic.door import FrontDoor, Refused, refused, retry_after
from fleetgate.traffic.limits import FREE, OverLimit, PricingSettings, Reservation
from fleetgate.traffic.priority import Priority
from fleetgate.traffic.tenants import Tenant
from fleetgate.upstream.attempt import Exchange


class Entry(msgspec.Struct):
    """An admitted request's holds, given back by `Entrance.leave`."""

    tenant: str
    priority: Priority
    held: Reservation | None  # of its tenant's limits (None: no limits to reconcile)
    ticket: Ticket | None  # its place in the pool (None: the pool admits without a queue)
    admission: Admission | None

    @property
    def waiting(self) -> bool:
        """It has no place in its pool yet (`Entrance.enter` waits for one)."""
        return self.ticket is not None and not self.ticket.admitted


class Entrance:
    def __init__(
        self,
        door: FrontDoor | None,
        pricing: Mapping[str, PricingSettings] | None = None,
        assumed_output_tokens: int = 256,
    ) -> None:
        self._limits = None if door is None else door.limits  # reserved and settled here
        self._pricing = {m: p for m, p in (pricing or {}).items() if p != FREE}
        self._assumed = assumed_output_tokens

    async def enter(
        self, request: InferenceRequest, ex: Exchange, admission: Admission | None
    ) -> Entry:
        """The request's holds: its tenant's limits taken, then its place in its pool (waited
        for when there is none yet); or `Refused` (429 over a limit, 503 shed, 400 bad
        metadata)."""
        caller, metadata = request.caller, request.metadata
        tenant = caller.tenant
        priority = self._priority(tenant, metadata)
        held = None
        if tenant.limited and self._limits is not None:
            routing = ex.routing
            pricing = self._pricing.get(ex.model, FREE) if self._pricing else FREE
            answer = await self._limits.reserve(
                tenant, caller.key_id, routing.prompt_tokens, routing.max_tokens, pricing
            )
            if isinstance(answer, OverLimit):
                raise refused(answer, priority)
            held = answer
            ex.count_usage = held.plan.counts_tokens
            ex.reply_head = held.head
        entry = self._entry(tenant, priority, held, ex, metadata, admission)
        if entry.waiting:
            await self._wait(entry)
        return entry

    async def _wait(self, entry: Entry) -> None:
        """Wait for the entry's place in its pool; `Refused` (503, or 429 at its tenant's
        own cap) when none comes by its deadline."""
        assert entry.ticket is not None and entry.admission is not None
        try:
            await entry.admission.wait(entry.ticket)
        except BaseException as exc:  # shed, or the client left: nothing was used
            if entry.held is not None:
                assert self._limits is not None
                await self._limits.settle(entry.held, 0, 0)
            if isinstance(exc, Shed):
                wait = [retry_after(exc.retry_after_s)]
                raise Refused(
                    exc.status, exc.message, exc.code, wait, priority=entry.priority
                ) from None
            raise

    @staticmethod
    def _priority(tenant: Tenant, metadata: Mapping[bytes, bytes]) -> Priority:
        asked = metadata.get(PRIORITY_HEADER)
        if asked is None:
            return tenant.priority
        try:
            return tenant.priority_for(asked)
        except ValueError as exc:
            raise Refused(400, f"x-fleetgate-priority: {exc}.", "invalid_priority") from None

    def _entry(
        self,
        tenant: Tenant,
        priority: Priority,
        held: Reservation | None,
        ex: Exchange,
        metadata: Mapping[bytes, bytes],
        admission: Admission | None,
    ) -> Entry:
        """The entry, its ticket admitted at once when there is room."""
        if self._pricing:
            pricing = self._pricing.get(ex.model)
            if pricing is not None:  # its spend is counted
                ex.count_usage = True
                ex.price = pricing.cost_usd
        ex.priority = int(priority)
        if admission is None:
            return Entry(tenant.name, priority, held, None, None)
        settings = tenant.settings
        routing = ex.routing
        deadline = settings.queue_timeout_s
        if QUEUE_TIMEOUT_HEADER in metadata:
            deadline = queue_timeout(metadata, deadline)
        ticket = Ticket(
            tenant.name, priority, settings.batch or metadata.get(LANE_HEADER) == b"batch",
            routing.prompt_tokens + (routing.max_tokens or self._assumed), settings.weight,
            ex.started + deadline,
        )  # fmt: skip
        ex.batch = ticket.batch
        admission.admit_now(ticket)
        return Entry(tenant.name, priority, held, ticket, admission)

    async def leave(self, entry: Entry, ex: Exchange) -> None:
        """Give back the request's place, and reconcile its limits with what it used (as its
        Finished said)."""
        if entry.ticket is not None and entry.admission is not None:
            entry.admission.leave(entry.ticket)
        if entry.held is None or self._limits is None:
            return
        used = ex.used()
        if used is not None:
            await self._limits.settle(entry.held, used[0], used[1])
