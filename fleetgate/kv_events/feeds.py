"""Subscribing to each engine's KV-cache events, in order, with gaps replayed.

One `EventFeed` per backend that publishes: a ZMQ SUB socket on its `endpoint` (ZMQ connects,
and reconnects after the engine restarts, on its own) and a DEALER on its `replay_endpoint`,
vLLM's replay protocol (send `[b"", start]`; receive `[b"", seq, batch]` for each batch the
engine still keeps from `start` on, then one whose batch is empty). Each PUB message is
`(topic, 8-byte big-endian sequence, batch)`, applied to the pool's EngineBlockIndex in order:
- the sequence expected: applied;
- a later one (batches were lost: the subscriber fell behind ZMQ's high-water mark, or the
  connection broke): the missing ones are replayed and applied first. If the engine no
  longer keeps them all (or there is no replay socket), what the index holds for the backend
  cannot be trusted: it is forgotten, and the feed goes on from this batch;
- an earlier one: a batch already applied (the same bytes: replayed, then heard) is skipped;
  any other means the engine restarted (sequences start at 0 in each engine process): its
  blocks are forgotten, what the new engine sent before this batch is read from the replay
  socket, then this batch is applied.
ZMQ delivers only what is published after the SUB socket connects, so at each connection the
feed asks the replay socket:
- the first time, for everything the engine keeps: a gateway started after its engines learns
  what they hold already;
- again, after losing the publisher, for the last batch it applied: the same bytes mean the
  same engine process (the connection broke, nothing more); anything else, or nothing, means
  another process (one that may publish as many batches as the old one did before this feed
  hears any, so sequences alone cannot tell): the backend's blocks are forgotten, and the new
  engine's are read as the first time. An engine that restarts is forgotten within one replay
  of its coming back.
A message that does not decode is counted and skipped (its sequence still counts as heard).
`FeedStatus` is what the metrics read (observe/fleet_metrics.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Iterator

import zmq
import zmq.asyncio
from xxhash import xxh3_64_intdigest
from zmq.utils.monitor import parse_monitor_message

from fleetgate.kv_events.index import EngineBlockIndex
from fleetgate.kv_events.settings import KvEventsConfig
from fleetgate.kv_events.status import FeedStatus
from fleetgate.kv_events.wire import WireError, decode_batch
from fleetgate.routing.prefix_index import entries_for

log = logging.getLogger(__name__)

INDEX_MEMORY_MB = 64.0  # each pool's EngineBlockIndex, as the prefix_cache scorer's default
RECENT = 256  # batches remembered (sequence -> hash of its bytes) to tell a replayed one again


class EventFeed:
    """One backend's events into its pool's index (see the module docstring)."""

    def __init__(
        self,
        status: FeedStatus,
        settings: KvEventsConfig,
        index: EngineBlockIndex,
        ctx: zmq.asyncio.Context,
        wall_clock: Callable[[], float],
    ) -> None:
        assert settings.endpoint is not None  # a sim's is filled in before (running.start_sims)
        self.status = status
        self._settings = settings
        self._index = index
        self._ctx = ctx
        self._wall_clock = wall_clock
        self._next: int | None = None  # the sequence expected next; None before the first
        self._recent: OrderedDict[int, int] = OrderedDict()  # seq -> hash of its bytes
        self._lock = asyncio.Lock()  # one message, or one connection's replay, at a time
        self._said = False  # a failure was logged

    async def run(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self._settings.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        watching = asyncio.get_running_loop().create_task(self._watch(monitor))
        sub.connect(self._settings.endpoint or "")
        try:
            while True:
                frames = await sub.recv_multipart()
                try:
                    await self.take(frames)
                except Exception:  # a bug, or a batch no check foresaw: the feed goes on
                    self._broke("applying a KV-event batch")
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            sub.disable_monitor()
            monitor.close()
            sub.close()

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                try:
                    await self.connected()
                except Exception:
                    self._broke("checking a reconnected KV-event publisher")

    def _broke(self, doing: str) -> None:
        """Count it with the undecodable, and say it once per feed."""
        self.status.undecodable += 1
        if not self._said:
            self._said = True
            log.exception("%s from %s failed", doing, self.status.backend)

    async def connected(self) -> None:
        """The SUB socket (re)connected: catch up, or check the engine is the same one."""
        async with self._lock:
            last = self._next
            if last is not None and not await self._still_has(last - 1):
                self.status.restarts += 1
                self._index.forget(self.status.backend)
                self._next = None
                self._recent.clear()
            if self._next is None:
                await self._catch_up(None)

    async def _catch_up(self, before: int | None) -> None:
        """Apply what the engine keeps (before sequence `before`), from its first batch."""
        if self._settings.replay_endpoint is None:
            return
        async with contextlib.aclosing(self._replayed(0)) as replies:
            async for seq, payload in replies:
                if before is not None and seq >= before:
                    break
                self._apply(seq, payload)

    async def _still_has(self, seq: int) -> bool:
        """Whether the replay socket keeps batch `seq` as it was applied here."""
        if self._settings.replay_endpoint is None:
            return False
        async with contextlib.aclosing(self._replayed(seq)) as replies:
            async for got, payload in replies:
                return got == seq and self._recent.get(seq) == xxh3_64_intdigest(payload)
        return False

    async def take(self, frames: list[bytes]) -> None:
        """One PUB message."""
        async with self._lock:
            if len(frames) != 3 or len(frames[1]) != 8:
                self.status.undecodable += 1
                return
            seq, payload = int.from_bytes(frames[1], "big"), frames[2]
            if self._next is None and seq > 0:
                await self._catch_up(seq)  # heard before the connection's replay was asked
            expected = self._next
            if expected is not None and seq != expected:
                if seq < expected:
                    if self._recent.get(seq) == xxh3_64_intdigest(payload):
                        return  # replayed already
                    self.status.restarts += 1
                    self._index.forget(self.status.backend)
                    self._recent.clear()
                    self._next = None
                    await self._catch_up(seq)  # what the new engine sent before this
                else:
                    await self._fill(expected, seq)
            self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        self._next = seq + 1
        self._recent[seq] = xxh3_64_intdigest(payload)
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)
        try:
            batch = decode_batch(payload)
        except WireError:
            self.status.undecodable += 1
            return
        self._index.apply(self.status.backend, batch.events)
        self.status.batches += 1
        self.status.lag_s = max(0.0, self._wall_clock() - batch.ts)

    async def _fill(self, start: int, end: int) -> None:
        """Batches [start, end) from the replay socket, or forget the backend."""
        got = start
        if self._settings.replay_endpoint is not None:
            async with contextlib.aclosing(self._replayed(start)) as replies:
                async for seq, payload in replies:
                    if seq > got:
                        break  # the engine no longer keeps `got`
                    if seq == got:
                        self._apply(seq, payload)
                        got += 1
                    if got >= end:
                        break
        if got < end:
            self.status.lost += 1
            self._index.forget(self.status.backend)
        else:
            self.status.replayed += 1

    async def _replayed(self, start: int) -> AsyncGenerator[tuple[int, bytes], None]:
        """(sequence, batch) as the replay socket sends them from `start`, until its end
        marker or `replay_timeout_s` of silence."""
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self._settings.replay_endpoint or "")
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                try:
                    async with asyncio.timeout(self._settings.replay_timeout_s):
                        frames = await dealer.recv_multipart()
                except (TimeoutError, zmq.ZMQError):
                    return
                # [b"", seq, batch], or [b"", topic, seq, batch] (vLLM since 2026); the end
                # marker's batch is empty.
                if len(frames) < 3 or not frames[-1]:
                    return
                yield int.from_bytes(frames[-2], "big", signed=True), frames[-1]
        finally:
            dealer.close()


class KvEventFeeds:
    """Every backend's feed, and each pool's index of what its engines hold."""

    def __init__(self, wall_clock: Callable[[], float]) -> None:
        self._wall_clock = wall_clock
        self._ctx: zmq.asyncio.Context | None = None
        self._indexes: dict[str, EngineBlockIndex] = {}
        self._feeds: list[EventFeed] = []
        self._tasks: list[asyncio.Task[None]] = []

    def follow(self, pool: str, backend_id: str, settings: KvEventsConfig) -> None:
        """Read the backend's events into `pool`'s index (from `start`)."""
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        index = self._indexes.get(pool)
        if index is None:
            index = self._indexes[pool] = EngineBlockIndex(entries_for(INDEX_MEMORY_MB))
        status = FeedStatus(pool, backend_id)
        self._feeds.append(EventFeed(status, settings, index, self._ctx, self._wall_clock))

    def index(self, pool: str) -> EngineBlockIndex | None:
        """The pool's index (None: no backend of it publishes)."""
        return self._indexes.get(pool)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(feed.run()) for feed in self._feeds]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def status(self) -> Iterator[FeedStatus]:
        for feed in self._feeds:
            feed.status.blocks = self._indexes[feed.status.pool].blocks(feed.status.backend)
            yield feed.status
