"""The sim worker's KV-cache events, published as vLLM publishes them (`--kv-events-config`).

What the engine's block manager stores and evicts in one turn of the event loop (one engine
step) becomes one batch: a ZMQ PUB message `(topic, 8-byte big-endian sequence, msgpack batch)`
(kv_events/wire.py; either encoding), sequence numbers counting from 0 for this process. The
last `buffer` batches are kept for the replay socket, a ROUTER answering a request
`[b"", start_seq]` with `[b"", seq, payload]` for each kept batch from `start_seq` on, then
`[b"", -1, b""]`: vLLM's replay protocol. PUB never blocks: a subscriber too slow to keep up
loses batches (ZMQ's high-water mark) and asks the replay socket for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

from fleetgate.kv_events.wire import Batch, Cleared, Event, Removed, Stored, encode_batch
from fleetgate.tokens import token_ids
from fleetgate.workers.sim.kvcache import Pieces
from fleetgate.workers.sim.spec import KvEventsSpec

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_MASK = (1 << 64) - 1


class KvEventPublisher:
    """Collects the block manager's events (kvcache.BlockEvents) and publishes them."""

    def __init__(
        self,
        spec: KvEventsSpec,
        block_size: int,
        clock: Callable[[], float],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._spec = spec
        self._block_size = block_size
        self._clock = clock  # wall clock: a batch's ts, seconds since the epoch
        self._loop = loop
        self._topic = spec.topic.encode()
        self._pending: list[Event] = []
        self._evicted: list[int] = []  # evictions since the last other event
        self._scheduled = False  # a flush is due at the end of this turn of the loop
        self._seq = itertools.count()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=spec.buffer)
        self._ctx = zmq.asyncio.Context()
        self._pub: zmq.Socket[bytes] = zmq.Socket(self._ctx, zmq.PUB)  # sends without waiting
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.MAXMSGSIZE, 64)  # a replay request is 8 bytes
        self._replaying: asyncio.Task[None] | None = None
        self.endpoint = ""
        self.replay_endpoint = ""

    def start(self, host: str) -> None:
        """Bind both sockets (ZMQError when a port is taken) and start answering replays."""
        self.endpoint = _bind(self._pub, host, self._spec.port)
        self.replay_endpoint = _bind(self._router, host, self._spec.replay_port)
        self._replaying = self._loop.create_task(self._serve_replays())

    def close(self) -> None:
        if self._replaying is not None:
            self._replaying.cancel()
        self._pub.close(linger=0)  # made apart from the context: destroy would not close it
        self._ctx.destroy(linger=0)

    # kvcache.BlockEvents
    def stored(self, hashes: Sequence[int], parent: int | None, pieces: Pieces) -> None:
        if not pieces:
            return  # no tokens to report (a prompt made without them): subscribers skip it
        unsigned = tuple(h & _MASK for h in hashes)
        self._add(Stored(unsigned, None if parent is None else parent & _MASK,
                         tuple(token_ids(pieces)), self._block_size, None, "GPU"))  # fmt: skip

    def removed(self, block_hash: int) -> None:
        self._schedule()
        self._evicted.append(block_hash & _MASK)  # one event for a run of evictions

    def cleared(self) -> None:
        self._add(Cleared())

    def _add(self, event: Event) -> None:
        self._schedule()
        self._end_evictions()
        self._pending.append(event)

    def _end_evictions(self) -> None:
        if self._evicted:
            self._pending.append(Removed(tuple(self._evicted), "GPU"))
            self._evicted = []

    def _schedule(self) -> None:
        """The batch goes out at the end of this turn of the loop (one engine step)."""
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        self._end_evictions()
        events, self._pending = self._pending, []
        seq = next(self._seq)
        payload = encode_batch(Batch(self._clock(), tuple(events), 0), self._spec.encoding)
        self._buffer.append((seq, payload))
        # No room (ZMQ's high-water mark): subscribers find the gap and replay it.
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload], zmq.NOBLOCK)

    async def _serve_replays(self) -> None:
        router = self._router
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3 or frames[1] or len(frames[2]) != 8:
                continue  # not a replay request
            client, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            await router.send_multipart([client, b"", END_SEQ, b""])


def _bind(socket: zmq.Socket[bytes] | zmq.asyncio.Socket, host: str, port: int) -> str:
    if port:
        endpoint = f"tcp://{host}:{port}"
        socket.bind(endpoint)
        return endpoint
    socket.bind(f"tcp://{host}:*")
    last = socket.getsockopt(zmq.LAST_ENDPOINT)
    return last.decode() if isinstance(last, bytes) else str(last)
