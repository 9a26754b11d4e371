"""A fair queue: requests of several tenants, served in proportion to their weights and to
what each request costs, however many each tenant sends.

Start-time fair queuing (Goyal et al., 1996), with the cost of a request in tokens; a tag is
given to a tenant's first waiting request only, when it gets to the head of its tenant's line:

    start(head) = max(V, finish(the tenant's last request served))
    finish(r)   = start(r) + cost(r) / weight(tenant)          when r is served
    serve the head with the smallest start; V = that start

A tenant that sends long prompts gets as many tokens through as one that sends short ones,
not as many requests; a tenant back from idle starts at V, with no credit saved up. Each
tenant's requests are served in the order they came. A request that leaves unserved (its
deadline, its client) costs its tenant nothing: tags given at push time would keep the
place of every request that timed out, so a tenant whose requests time out would fall
further behind with each (measured: the tenant offering 2.5x got 20-60% less than an equal
one offering 1x). A tenant may be held (at its concurrency cap): its requests wait without
holding up anyone else's.
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


def _place(item: tuple[float, float, object]) -> float:
    return item[0]


class FairQueue(Generic[W]):
    """Entries by tenant, taken out fairly (module docstring); O(log tenants) per entry."""

    def __init__(self) -> None:
        # tenant: (place, weight, entry)..., place: cost / weight of what it pushed before
        self._waiting: dict[str, deque[tuple[float, float, W]]] = {}
        self._pushed: dict[str, float] = {}  # cost / weight of all a tenant has pushed
        # Each waiting tenant's head: its start tag, and the seq of its entry in `_ready`
        # (0: none; an entry of another seq is out of date and skipped).
        self._head: dict[str, tuple[float, int]] = {}
        self._ready: list[tuple[float, int, str]] = []  # (head's start, seq, tenant), heap
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
        every tenant whose start would not be after its own."""
        waiting = self._waiting
        mine = waiting.get(tenant)
        if mine:
            start = self._head[tenant][0] + self._pushed[tenant] - mine[0][0]
        else:
            start = max(self._vtime, self._finish.get(tenant, 0.0))
        count = 0
        for name, queue in waiting.items():
            # Entry j of `name` would start at head + (place_j - place_head).
            count += bisect_right(queue, start - self._head[name][0] + queue[0][0], key=_place)
        return count

    def push(self, entry: W, weight: float) -> None:
        tenant = entry.tenant
        place = self._pushed.get(tenant, 0.0)
        self._pushed[tenant] = place + entry.cost / weight
        queue = self._waiting.setdefault(tenant, deque())
        queue.append((place, weight, entry))
        self._len += 1
        if len(queue) == 1:
            self._list(tenant, max(self._vtime, self._finish.get(tenant, 0.0)))

    def pop(self) -> W | None:
        """The next entry of a tenant not held, or None."""
        while self._ready:
            start, seq, tenant = heapq.heappop(self._ready)
            head = self._head.get(tenant)
            if head is None or head[1] != seq:
                continue  # out of date
            self._head[tenant] = (start, 0)
            if tenant in self._held:
                continue  # listed again on release
            queue = self._waiting[tenant]
            _, weight, entry = queue.popleft()
            self._len -= 1
            if not entry.gone:  # served: the tenant's next starts where this one finishes
                self._vtime = max(self._vtime, start)
                start = self._finish[tenant] = start + entry.cost / weight
            if queue:
                self._list(tenant, start)
            else:
                self._forget(tenant)
            if not entry.gone:
                return entry
        return None

    def charge(self, tenant: str, amount: float) -> None:
        """`tenant` holds `amount` (cost / weight) of places taken without waiting, while
        nothing waited: its next request starts no sooner than that past V. So when a pool
        fills, the tenant that took more of it first waits its turn, as it would have had
        they all come through the queue (with `max`, never charged twice for the same)."""
        self._finish[tenant] = max(self._finish.get(tenant, 0.0), self._vtime + amount)

    def hold(self, tenant: str) -> None:
        """Serve none of `tenant`'s entries until `release`."""
        self._held.add(tenant)

    def release(self, tenant: str) -> None:
        if tenant in self._held:
            self._held.discard(tenant)
            if self._waiting.get(tenant):
                self._list(tenant, self._head[tenant][0])

    def remove_newest(self) -> W | None:
        """Take out the entry that came last of the tenant with most waiting (to make room
        for a more urgent one), or None."""
        if not self._waiting:
            return None
        tenant = max(self._waiting, key=lambda t: len(self._waiting[t]))
        queue = self._waiting[tenant]
        place, _, entry = queue.pop()
        self._pushed[tenant] = place
        self._len -= 1
        if not queue:
            self._forget(tenant)
        return entry

    def entries(self) -> Iterator[W]:
        for queue in self._waiting.values():
            for _, _, entry in queue:
                yield entry

    def forget_gone(self) -> None:
        """Drop entries that left on their own (called when they pile up)."""
        for tenant in list(self._waiting):
            queue = self._waiting[tenant]
            kept = deque(item for item in queue if not item[2].gone)
            self._len -= len(queue) - len(kept)
            if kept:
                self._waiting[tenant] = kept
            else:
                self._forget(tenant)

    def _forget(self, tenant: str) -> None:
        """`tenant` has nothing waiting (a heap entry it may still have is skipped)."""
        self._waiting.pop(tenant, None)
        self._head.pop(tenant, None)
        self._pushed.pop(tenant, None)  # places count from 0 again

    def _list(self, tenant: str, start: float) -> None:
        """`tenant`'s head starts at `start`: in `_ready` unless it is held."""
        if tenant in self._held:
            self._head[tenant] = (start, 0)
            return
        self._seq += 1
        self._head[tenant] = (start, self._seq)
        heapq.heappush(self._ready, (start, self._seq, tenant))
