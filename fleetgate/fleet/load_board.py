"""The load board: what the gateway has sent each backend and not yet had back, by backend id.

    in_flight         requests sent, not finished
    in_flight_tokens  their prompt tokens (estimated)
    pending_prefill   prompt tokens sent whose first token has not come back (estimated)

The lifecycle's accounting writes it (lifecycle/accounting.py through fleet/pool.py: `begin`
when an attempt is sent, `prefilled` at its first token, `end` when it is over); routing reads
it (routing/load.py). It is keyed by backend ids, never by live objects, so that a board
shared by several gateways (issue 29: Redis, each gateway's counts as leases with a TTL) can
stand where this process's own board stands. Reads are synchronous and do no I/O: a shared
board keeps a local copy of each record current in place, as this one does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol


class BackendLoad:
    """One backend's counts on a board. Read it; only its board writes it."""

    __slots__ = ("in_flight", "in_flight_tokens", "pending_prefill")

    def __init__(self) -> None:
        self.in_flight = 0
        self.in_flight_tokens = 0
        self.pending_prefill = 0

    def __repr__(self) -> str:
        return (
            f"BackendLoad(in_flight={self.in_flight}, in_flight_tokens={self.in_flight_tokens},"
            f" pending_prefill={self.pending_prefill})"
        )


class LoadBoard(Protocol):
    """Each backend's in-flight requests, their prompt tokens and the prompt tokens awaiting
    prefill, by backend id.

    `load` returns the same record for an id until `forget`, kept current in place: a reader
    may hold it (routing looks each candidate up once per candidate set, routing/load.py) and
    a writer looks it up once per change, never once per counter."""

    def load(self, backend_id: str) -> BackendLoad:
        """The backend's record (all zero for one the board has not seen)."""
        ...

    def loads(self, backend_ids: Iterable[str]) -> list[BackendLoad]:
        """The records of these backends, in order (a candidate set's, in one call)."""
        ...

    def begin(self, backend_id: str, prompt_tokens: int) -> BackendLoad:
        """A request with this many prompt tokens was sent to the backend; its record after."""
        ...

    def prefilled(self, backend_id: str, prompt_tokens: int) -> None:
        """A request's first token came back: its prompt no longer waits for prefill."""
        ...

    def end(self, backend_id: str, prompt_tokens: int, unprefilled: int) -> BackendLoad:
        """A request is over: `prompt_tokens` as given to `begin`, `unprefilled` those of them
        `prefilled` has not released. Its record after."""
        ...

    def forget(self, backend_id: str) -> None:
        """The backend left with nothing in flight: drop its record."""
        ...

    @property
    def gateways(self) -> int:
        """How many gateways count on the board, this one too (1 for one nobody shares): a
        pool's concurrency limit is theirs together."""
        ...

    def watch_gateways(self, changed: Callable[[int], None]) -> None:
        """Call `changed(gateways)` whenever that count changes (never, on a board nobody
        shares)."""
        ...

    def unwatch_gateways(self, changed: Callable[[int], None]) -> None:
        """No longer call `changed` (its limit was replaced: a reloaded config's)."""
        ...

    def own(self, backend_id: str) -> BackendLoad:
        """This gateway's own counts for the backend: on a board no other gateway shares, the
        record `load` gives (a backend retired here waits for these alone)."""
        ...

    def watch(self, changed: Callable[[str, float], None]) -> None:
        """Call `changed(backend_id, now)` for each record that other gateways' requests
        changed (a shared board's sync); a board nobody shares never calls it."""
        ...


class MemoryLoadBoard:
    """The board in this process's memory (one gateway): a dict of slotted records by id,
    each change a lookup and a few integer additions, as the fields on the backend's state
    were before."""

    __slots__ = ("_loads",)

    def __init__(self) -> None:
        self._loads: dict[str, BackendLoad] = {}

    @property
    def gateways(self) -> int:
        return 1

    def watch_gateways(self, changed: Callable[[int], None]) -> None:
        pass  # alone for good

    def unwatch_gateways(self, changed: Callable[[int], None]) -> None:
        pass

    def load(self, backend_id: str) -> BackendLoad:
        load = self._loads.get(backend_id)
        if load is None:
            load = self._loads[backend_id] = BackendLoad()
        return load

    def loads(self, backend_ids: Iterable[str]) -> list[BackendLoad]:
        get, load = self._loads.get, self.load
        return [get(backend) or load(backend) for backend in backend_ids]

    def begin(self, backend_id: str, prompt_tokens: int) -> BackendLoad:
        try:
            load = self._loads[backend_id]
        except KeyError:
            load = self._loads[backend_id] = BackendLoad()
        load.in_flight += 1
        load.in_flight_tokens += prompt_tokens
        load.pending_prefill += prompt_tokens
        return load

    def prefilled(self, backend_id: str, prompt_tokens: int) -> None:
        self._loads[backend_id].pending_prefill -= prompt_tokens

    def end(self, backend_id: str, prompt_tokens: int, unprefilled: int) -> BackendLoad:
        load = self._loads[backend_id]
        load.in_flight -= 1
        load.in_flight_tokens -= prompt_tokens
        load.pending_prefill -= unprefilled
        return load

    def forget(self, backend_id: str) -> None:
        self._loads.pop(backend_id, None)

    def own(self, backend_id: str) -> BackendLoad:
        return self.load(backend_id)

    def watch(self, changed: Callable[[str, float], None]) -> None:
        pass  # no one else counts here

    def __len__(self) -> int:
        """Backends with a record."""
        return len(self._loads)
