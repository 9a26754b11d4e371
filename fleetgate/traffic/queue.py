"""A fair queue: requests of several tenants, served in proportion to their weights and to
what each request costs, however many each tenant sends.

Start-time fair queuing (Goyal et al., 1996), with the cost of a request in tokens:

    start(r)  = max(V, finish(tenant's previous request))
    finish(r) = start(r) + cost(r) / weight(tenant)
    serve the waiting request with the smallest start; V = that start

A tenant that sends long prompts gets as many tokens through as one that sends short ones,
not as many requests; a tenant back from idle starts at V, with no credit saved up. Each
tenant's requests are served in the order they came. A tenant may be held (at its
concurrency cap): its requests wait without holding up anyone else's.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    """What the queue needs of an entry."""

    @property
    def tenant(self) -> str: ...

    @property
    def cost(self) -> float: ...

    @property
    def gone(self) -> bool:
        """The entry left the queue on its own (its deadline, its client): skip it."""


W = TypeVar("W", bound=Queued)


def _start(item: tuple[float, object]) -> float:
    return item[0]


class FairQueue(Generic[W]):
    """Entries by tenant, taken out fairly (module docstring); O(log tenants) per entry."""

    def __init__(self) -> None:
        self._waiting: dict[str, deque[tuple[float, W]]] = {}  # tenant: (start, entry)...
        self._ready: list[tuple[float, int, str]] = []  # (head's start, seq, tenant), heap
        self._listed: set[str] = set()  # tenants with an entry in `_ready`
        self._finish: dict[str, float] = {}  # each tenant's last finish tag
        self._held: set[str] = set()
        self._vtime = 0.0
        self._seq = 0
        self._len = 0

    def __len__(self) -> int:
        """Entries waiting (those gone but not yet skipped included)."""
        return self._len

    def ready(self) -> int:
        """Entries waiting of tenants not held: those `pop` may give."""
        if not self._held:
            return self._len
        held = sum(len(self._waiting[t]) for t in self._held if t in self._waiting)
        return self._len - held

    def ahead(self, tenant: str) -> int:
        """How many waiting entries would be served before a new one of `tenant`: those of
        every tenant whose start is not after the one it would get."""
        start = max(self._vtime, self._finish.get(tenant, 0.0))
        return sum(bisect_right(queue, start, key=_start) for queue in self._waiting.values())

    def push(self, entry: W, weight: float) -> None:
        tenant = entry.tenant
        start = max(self._vtime, self._finish.get(tenant, 0.0))
        self._finish[tenant] = start + entry.cost / weight
        queue = self._waiting.setdefault(tenant, deque())
        queue.append((start, entry))
        self._len += 1
        if len(queue) == 1:
            self._list(tenant)

    def refund(self, entry: W, weight: float) -> None:
        """`entry` left unserved (its deadline, its client): its tenant's next entry starts
        as if it had never come (else a tenant whose requests time out falls further behind
        with each, and is shed as hopeless: first come first served in reverse)."""
        tenant = entry.tenant
        finish = self._finish.get(tenant)
        if finish is not None:
            self._finish[tenant] = max(self._vtime, finish - entry.cost / weight)

    def pop(self) -> W | None:
        """The next entry of a tenant not held, or None."""
        while self._ready:
            _, _, tenant = heapq.heappop(self._ready)
            self._listed.discard(tenant)
            queue = self._waiting.get(tenant)
            if not queue or tenant in self._held:
                continue
            start, entry = queue.popleft()
            self._len -= 1
            self._vtime = max(self._vtime, start)
            if queue:
                self._list(tenant)
            else:
                del self._waiting[tenant]
            if not entry.gone:
                return entry
        return None

    def hold(self, tenant: str) -> None:
        """Serve none of `tenant`'s entries until `release`."""
        self._held.add(tenant)

    def release(self, tenant: str) -> None:
        if tenant in self._held:
            self._held.discard(tenant)
            if self._waiting.get(tenant):
                self._list(tenant)

    def remove_newest(self) -> W | None:
        """Take out the entry that came last of the tenant with most waiting (to make room
        for a more urgent one), or None."""
        if not self._waiting:
            return None
        tenant = max(self._waiting, key=lambda t: len(self._waiting[t]))
        queue = self._waiting[tenant]
        _, entry = queue.pop()
        self._len -= 1
        if not queue:
            del self._waiting[tenant]
        return entry

    def entries(self) -> Iterator[W]:
        for queue in self._waiting.values():
            for _, entry in queue:
                yield entry

    def forget_gone(self) -> None:
        """Drop entries that left on their own (called when they pile up)."""
        for tenant in list(self._waiting):
            queue = self._waiting[tenant]
            kept = deque(item for item in queue if not item[1].gone)
            self._len -= len(queue) - len(kept)
            if kept:
                self._waiting[tenant] = kept
            else:
                del self._waiting[tenant]
        self._ready = [item for item in self._ready if item[2] in self._waiting]
        heapq.heapify(self._ready)
        self._listed = {item[2] for item in self._ready}
        for tenant, queue in self._waiting.items():
            if tenant not in self._listed and tenant not in self._held and queue:
                self._list(tenant)

    def _list(self, tenant: str) -> None:
        if tenant in self._listed or tenant in self._held:
            return
        self._seq += 1
        heapq.heappush(self._ready, (self._waiting[tenant][0][0], self._seq, tenant))
        self._listed.add(tenant)
