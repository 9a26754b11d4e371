"""The `state:` section and what it builds: the routing state this gateway shares with the
others on one Redis (`state.url`; none: this process's own, as one gateway alone keeps it).

    state:
      url: redis://cache:6379/0   # or `fleetgate serve --state redis://cache:6379/0`
      key_prefix: fleetgate       # of the Redis keys, to share one Redis between fleets
      sync_s: 0.05                # each gateway publishes its decisions and reads the others'
      load_sync_s: 0.01           # ... and its in-flight counts (the load board alone)
      ttl_s: 2.0                  # how long a dead gateway's counts outlive it

Shared: each pool's load board (shared/load_board.py), so every gateway routes by the
requests all of them have in flight; each pool's prefix index (shared/prefix_index.py), so a
prompt's follow-up goes where any gateway sent its prefix; each pool's session table and the
Responses pins (shared/tables.py), so a conversation stays home whichever gateway its turns
reach. What is shared is never waited for by a request: it is read from memory, and synced in
the background: the load boards every `load_sync_s` (one Redis command per pool: the
in-flight counts change with every request, and routing is only as good as they are fresh),
the rest every `sync_s`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetgate.clock import Clock
from fleetgate.fleet.load_board import LoadBoard, MemoryLoadBoard
from fleetgate.fleet.periodic import PeriodicTasks
from fleetgate.routing.prefix_index import MemoryPrefixIndex
from fleetgate.routing.session_table import MemorySessionTable
from fleetgate.routing.stored_responses import StoredResponses
from fleetgate.routing.stores import (
    EngineBlocks,
    PrefixIndex,
    PrefixIndexFactory,
    ResponsePins,
    SessionTable,
)
from fleetgate.settings import Settings, positive_seconds
from fleetgate.shared.answers import SharedAnswers
from fleetgate.shared.changes import ChangeMark
from fleetgate.shared.engine_blocks import SharedEngineBlocks
from fleetgate.shared.lease import Lease
from fleetgate.shared.load_board import SharedLoadBoard
from fleetgate.shared.prefix_index import SharedPrefixIndex
from fleetgate.shared.tables import SharedPins, SharedSessionTable
from fleetgate.traffic.redis_cancel import Execute, cancellable
from fleetgate.traffic.redis_store import redis_client

if TYPE_CHECKING:
    from fleetgate.kv_events.index import EngineBlockIndex

log = logging.getLogger(__name__)

# The parts synced every `sync_s`: each publishes its decisions and hears the others'.
Synced = SharedPrefixIndex | SharedSessionTable | SharedPins | SharedEngineBlocks


class StateSettings(Settings, frozen=True):
    """The `state:` section."""

    url: str | None = None  # redis://host:port/db; None: nothing shared
    key_prefix: str = "fleetgate"
    sync_s: float = 0.05
    load_sync_s: float = 0.01
    ttl_s: float = 2.0

    def __post_init__(self) -> None:
        positive_seconds("sync_s", self.sync_s)
        positive_seconds("load_sync_s", self.load_sync_s)
        positive_seconds("ttl_s", self.ttl_s)
        if self.ttl_s < 4 * self.load_sync_s:
            raise ValueError(
                f"`ttl_s` ({self.ttl_s:g}) must be at least 4 x `load_sync_s` "
                f"({self.load_sync_s:g}): a live gateway's counts would lapse between two of "
                "its syncs"
            )


@dataclass(frozen=True, slots=True)
class SharedStatus:
    """How one shared part of one pool is doing, for metrics."""

    part: str  # load_board, prefix_index, sessions, responses, engine_blocks
    pool: str  # its pool's name ("" for the gateway's Responses pins)
    up: bool  # its last sync reached Redis
    failures: int  # syncs Redis did not answer
    heard: int  # other gateways' decisions applied (0 for the load board: it sums leases)
    dropped: int  # decisions never published (Redis away too long)
    undecodable: int  # other gateways' entries skipped
    stale: int  # other gateways' entries heard too late to apply


@dataclass(frozen=True, slots=True)
class LeaseStatus:
    """Whether this gateway holds one lease, for metrics."""

    kind: str  # what it is on: batches (the runner of a batch directory)
    held: bool
    failures: int  # renewals Redis did not answer


class RoutingState:
    """Where this gateway keeps each pool's routing state: its memory, or (with a URL) a
    Redis it shares with the other gateways, synced from `start()` until `close()`."""

    def __init__(
        self, settings: StateSettings, clock: Clock, rng: random.Random,
        wall_clock: Callable[[], float] = time.time, *, execute: Execute | None = None,
    ) -> None:  # fmt: skip
        """`execute`: where Redis commands go instead of a client of `settings.url` (the
        simulator's Redis, in its memory and on its clock): the state is shared with it."""
        self._settings = settings
        self._clock = clock
        self._wall = wall_clock
        url = settings.url if execute is None else None
        client = None if url is None else redis_client(url)
        self._client = client
        self._shares = client is not None or execute is not None
        if execute is None:
            execute = _nothing_shared if client is None else cancellable(client.execute_command)
        self._execute: Execute = execute
        # Not drawn from `rng`: gateways started from one config (one seed) need distinct ids.
        self.gateway_id = secrets.token_hex(8)
        self._boards: list[tuple[str, SharedLoadBoard]] = []  # by pool
        self._synced: list[
            tuple[
                str, str, SharedPrefixIndex | SharedSessionTable | SharedPins | SharedEngineBlocks
            ]
        ] = []
        self._leases: list[tuple[str, Lease]] = []
        self._tasks = PeriodicTasks(rng, clock)
        self._broken: set[tuple[str, int]] = set()  # parts whose last sync raised (logged once)

    @property
    def shared(self) -> bool:
        return self._shares

    def lease(self, kind: str, name: str, ttl_s: float) -> Lease:
        """A lease among the gateways (`shared` only) on `name`, one of `kind` (its label in
        the metrics)."""
        assert self._shares
        key = f"{self._settings.key_prefix}:lease:{kind}:{name}"
        lease = Lease(self._execute, key, self.gateway_id, self._clock, ttl_s=ttl_s)
        self._leases.append((kind, lease))
        return lease

    def change_mark(self, kind: str, name: str) -> ChangeMark:
        """The mark of the last change to `name`, one of `kind` (`shared` only)."""
        assert self._shares
        key = f"{self._settings.key_prefix}:changes:{kind}:{name}"
        return ChangeMark(self._execute, key, self._clock, self.gateway_id)

    def leases(self) -> list[LeaseStatus]:
        """Each lease's, when scraped."""
        return [LeaseStatus(kind, lease.held(), lease.failures) for kind, lease in self._leases]

    def load_board(self, name: str) -> LoadBoard:
        """A new pool's board; `name` tells the pools apart on a shared Redis."""
        if not self._shares:
            return MemoryLoadBoard()
        s = self._settings
        board = SharedLoadBoard(
            self._execute, f"{s.key_prefix}:board:{name}", self.gateway_id,
            self._clock.now, ttl_s=s.ttl_s,
        )  # fmt: skip
        self._boards.append((name, board))
        return board

    def prefix_index(self, name: str) -> PrefixIndexFactory:
        """How a new pool's prefix_cache scorer makes its index (of `max_entries`)."""
        if not self._shares:
            return MemoryPrefixIndex

        def make(max_entries: int) -> PrefixIndex:
            index = SharedPrefixIndex(
                MemoryPrefixIndex(max_entries), self._execute,
                f"{self._settings.key_prefix}:prefix:{name}", self.gateway_id,
            )  # fmt: skip
            self._synced.append(("prefix_index", name, index))
            return index

        return make

    def engine_blocks(self, name: str, local: EngineBlockIndex) -> EngineBlocks:
        """A new pool's view of what its engines hold (their KV-cache events): the prompts
        each gateway sent and the engines have not reported yet, shared."""
        if not self._shares:
            return local
        blocks = SharedEngineBlocks(
            local, self._execute, f"{self._settings.key_prefix}:expected:{name}",
            self.gateway_id, self._clock.now, self._wall,
        )  # fmt: skip
        self._synced.append(("engine_blocks", name, blocks))
        return blocks

    def sessions(self, name: str) -> SessionTable:
        """A new pool's session table."""
        if not self._shares:
            return MemorySessionTable()
        table = SharedSessionTable(
            MemorySessionTable(), self._execute,
            f"{self._settings.key_prefix}:sessions:{name}", self.gateway_id,
        )  # fmt: skip
        self._synced.append(("sessions", name, table))
        return table

    def pins(self) -> ResponsePins:
        """The gateway's Responses pins (one for all pools: a response id names its pool)."""
        if not self._shares:
            return StoredResponses()
        pins = SharedPins(
            StoredResponses(), self._execute,
            f"{self._settings.key_prefix}:responses", self.gateway_id,
        )  # fmt: skip
        self._synced.append(("responses", "", pins))
        return pins

    def answers(self, ttl_s: float, hold_s: float) -> SharedAnswers:
        """The response cache's answers and flights, shared (`cache.store: redis`; the config
        check makes sure there is a Redis)."""
        assert self._shares
        return SharedAnswers(
            self._execute, f"{self._settings.key_prefix}:cache", self.gateway_id,
            self._clock, ttl_s=ttl_s, hold_s=hold_s,
        )  # fmt: skip

    def start(self) -> None:
        if self._shares:
            s = self._settings
            self._tasks.every(s.load_sync_s, 0.1, self.sync_loads, wait_first=False)
            self._tasks.every(s.sync_s, 0.1, self.sync_decisions, wait_first=False)

    async def sync(self) -> None:
        """Everything shared synced once."""
        await asyncio.gather(self.sync_loads(), self.sync_decisions())

    async def sync_loads(self) -> None:
        """Each pool's load board synced once."""
        await self._sync_parts("load", [board.sync() for _, board in self._boards])

    async def sync_decisions(self) -> None:
        """The prefix indexes, session tables and Responses pins synced once."""
        await self._sync_parts("decisions", [shared.sync() for _, _, shared in self._synced])

    async def _sync_parts(self, kind: str, syncs: list[Coroutine[Any, Any, bool]]) -> None:
        """Each part falls back by itself when Redis is away. A part that fails otherwise (a
        bug, or a Redis that answers what no part expects) is logged once and tried again at
        the next sync: the others and the syncs go on."""
        done = await asyncio.gather(*syncs, return_exceptions=True)
        for n, result in enumerate(done):
            part = (kind, n)
            if not isinstance(result, Exception):
                self._broken.discard(part)
            elif part not in self._broken:  # once, until it syncs again
                self._broken.add(part)
                log.error("syncing the shared state failed", exc_info=result)

    def status(self) -> list[SharedStatus]:
        """Each shared part's, when scraped (none: nothing is shared)."""
        found = [
            SharedStatus(part="load_board", pool=pool, up=board.shared, failures=board.failures,
                         heard=0, dropped=0, undecodable=0, stale=0)
            for pool, board in self._boards
        ]  # fmt: skip
        for part, pool, shared in self._synced:
            s = shared.stream
            found.append(
                SharedStatus(part=part, pool=pool, up=s.shared, failures=s.failures,
                             heard=s.heard, dropped=s.dropped, undecodable=s.undecodable,
                             stale=s.stale)
            )  # fmt: skip
        return found

    async def close(self) -> None:
        """Stop syncing and take this gateway's counts off at once."""
        self._tasks.stop()
        if not self._shares:
            return
        await asyncio.gather(*(board.leave() for _, board in self._boards))
        if self._client is not None:
            await self._client.aclose()


async def _nothing_shared(*command: Any) -> Any:
    """The Redis calls of a gateway without `state.url`: none is ever made."""
    raise RuntimeError("nothing is shared: no state.url")
