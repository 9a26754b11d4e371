"""The sim worker's publisher and the gateway's feed over real ZMQ sockets: batches in order,
gaps replayed from the replay socket (or the backend forgotten when it cannot be), a feed
started late catching up, and an engine that restarts forgotten."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import zmq
import zmq.asyncio

from fleetgate.kv_events.feeds import EventFeed, FeedStatus, KvEventFeeds
from fleetgate.kv_events.index import EngineBlockIndex
from fleetgate.kv_events.settings import KvEventsConfig
from fleetgate.kv_events.wire import Removed, decode_batch
from fleetgate.tokens import token_ids
from fleetgate.workers.sim.kv_publisher import KvEventPublisher
from fleetgate.workers.sim.spec import KvEventsSpec
from tests.e2e.procs import free_port

BS = 2
PIECES = [f" w{i}" for i in range(8)]  # 4 blocks
IDS = token_ids(PIECES)


@asynccontextmanager
async def publisher(
    buffer: int = 100, encoding: str = "map", ports: tuple[int, int] = (0, 0)
) -> AsyncIterator[KvEventPublisher]:
    """A started publisher (an engine), closed after."""
    spec = KvEventsSpec(*ports, encoding="array" if encoding == "array" else "map", buffer=buffer)
    pub = KvEventPublisher(spec, BS, time.time, asyncio.get_running_loop())
    pub.start("127.0.0.1")
    try:
        yield pub
    finally:
        pub.close()


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


async def publish_blocks(pub: KvEventPublisher) -> None:
    """Four batches, one block each, chained: sequences 0 to 3."""
    for i in range(4):
        pub.stored([1000 + i], 1000 + i - 1 if i else None, PIECES[i * BS : (i + 1) * BS])
        await asyncio.sleep(0)  # the batch goes out at the end of this turn of the loop


def frames(pub: KvEventPublisher, seq: int) -> list[bytes]:
    """Message `seq` as the PUB socket sent it (from the publisher's replay buffer)."""
    payload = dict(pub._buffer)[seq]
    return [b"kv-events", seq.to_bytes(8, "big"), payload]


def feed_of(pub: KvEventPublisher, ctx: zmq.asyncio.Context) -> tuple[EventFeed, EngineBlockIndex]:
    index = EngineBlockIndex(1000)
    settings = KvEventsConfig(
        endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint, replay_timeout_s=2.0
    )
    return EventFeed(FeedStatus("m", "b"), settings, index, ctx, time.time), index


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    for _ in range(int(timeout_s / 0.02)):
        if check():
            return True
        await asyncio.sleep(0.02)
    return check()


async def test_a_gap_is_replayed_from_the_replay_socket(ctx: zmq.asyncio.Context) -> None:
    async with publisher() as pub:
        await publish_blocks(pub)
        feed, index = feed_of(pub, ctx)
        await feed.take(frames(pub, 0))
        await feed.take(frames(pub, 3))  # 1 and 2 never arrived
        assert (feed.status.replayed, feed.status.lost, feed.status.batches) == (1, 0, 4)
        assert index.matches(IDS, ["b"], 0.0) == {"b": 8}


async def test_a_gap_the_engine_no_longer_keeps_forgets_the_backend(
    ctx: zmq.asyncio.Context,
) -> None:
    async with publisher(buffer=1) as pub:  # keeps only the last batch
        await publish_blocks(pub)
        feed, index = feed_of(pub, ctx)
        await feed.take([b"kv-events", b"\0" * 8, b""])  # seq 0, a batch that is not one
        await feed.take(frames(pub, 3))
        assert feed.status.lost == 1
        assert feed.status.undecodable == 1  # the empty first batch
        assert index.matches(IDS, ["b"], 0.0) == {}  # block 3 alone: its parent was forgotten


async def test_a_sequence_that_goes_back_is_an_engine_restarted(ctx: zmq.asyncio.Context) -> None:
    async with publisher() as pub:
        await publish_blocks(pub)
        feed, index = feed_of(pub, ctx)
        for seq in range(4):
            await feed.take(frames(pub, seq))
        assert index.matches(IDS, ["b"], 0.0) == {"b": 8}
        async with publisher() as restarted:  # a new engine process: sequences from 0
            restarted.stored([7], None, PIECES[:BS])
            await asyncio.sleep(0)
            await feed.take(frames(restarted, 0))
        assert feed.status.restarts == 1
        assert index.matches(IDS, ["b"], 0.0) == {"b": 2}  # only what the new engine stored


async def test_a_restarted_engine_heard_late_is_read_from_its_first_batch(
    ctx: zmq.asyncio.Context,
) -> None:
    ports = (free_port(), free_port())
    async with publisher(ports=ports) as pub:
        await publish_blocks(pub)
        feed, index = feed_of(pub, ctx)
        for seq in range(4):
            await feed.take(frames(pub, seq))
    async with publisher(ports=ports) as restarted:  # the same ports, sequences from 0
        restarted.stored([7], None, PIECES[:BS])
        await asyncio.sleep(0)
        restarted.stored([8], 7, PIECES[BS : 2 * BS])
        await asyncio.sleep(0)
        await feed.take(frames(restarted, 1))  # its batch 0 never arrived
        assert feed.status.restarts == 1
        assert index.matches(IDS, ["b"], 0.0) == {"b": 4}  # batch 0 from the replay, then 1


async def test_a_reconnection_to_the_same_engine_keeps_what_it_holds(
    ctx: zmq.asyncio.Context,
) -> None:
    async with publisher() as pub:
        await publish_blocks(pub)
        feed, index = feed_of(pub, ctx)
        for seq in range(4):
            await feed.take(frames(pub, seq))
        await feed.connected()  # its replay socket still has batch 3, as it was
        assert feed.status.restarts == 0
        assert index.matches(IDS, ["b"], 0.0) == {"b": 8}
        await feed.take(frames(pub, 2))  # heard again (replayed, then delivered): skipped
        assert feed.status.restarts == 0
        assert feed.status.batches == 4


@pytest.mark.parametrize("encoding", ["map", "array"])
async def test_feeds_follow_a_publisher_over_pub_sub(encoding: str) -> None:
    async with publisher(encoding=encoding) as pub:
        feeds = KvEventFeeds(time.time)
        feeds.follow("m", "b", KvEventsConfig(endpoint=pub.endpoint))  # no replay socket
        feeds.start()
        try:
            index = feeds.index("m")
            assert index is not None

            def heard() -> bool:
                pub.cleared()  # a SUB socket hears only what is sent once it has connected
                return index.follows("b")

            assert await eventually(heard)
            await publish_blocks(pub)
            assert await eventually(lambda: index.blocks("b") == 4)
            assert index.matches(IDS, ["b"], 0.0) == {"b": 8}
            (status,) = feeds.status()
            assert (status.blocks, status.lost) == (4, 0)
            assert 0 <= status.lag_s < 1
        finally:
            await feeds.close()


async def test_a_feed_started_after_its_engine_reads_what_it_holds_from_the_replay() -> None:
    async with publisher() as pub:
        await publish_blocks(pub)  # before anyone listens
        feeds = KvEventFeeds(time.time)
        settings = KvEventsConfig(endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint)
        feeds.follow("m", "b", settings)
        feeds.start()
        try:
            index = feeds.index("m")
            assert index is not None
            assert await eventually(lambda: index.blocks("b") == 4)
            assert index.matches(IDS, ["b"], 0.0) == {"b": 8}
        finally:
            await feeds.close()


async def test_a_steps_evictions_go_out_as_one_event_in_their_place() -> None:
    async with publisher() as pub:
        pub.stored([1], None, PIECES[:BS])
        pub.removed(5)
        pub.removed(6)
        pub.cleared()
        pub.removed(7)
        await asyncio.sleep(0)
        ((_, payload),) = pub._buffer
        events = decode_batch(payload).events
        assert [type(e).__name__ for e in events] == ["Stored", "Removed", "Cleared", "Removed"]
        assert events[1] == Removed((5, 6), "GPU")
        assert events[3] == Removed((7,), "GPU")


async def test_the_sims_replay_socket_refuses_what_is_not_a_replay_request(
    ctx: zmq.asyncio.Context,
) -> None:
    async with publisher() as pub:
        await publish_blocks(pub)
        junk = ctx.socket(zmq.DEALER)
        junk.setsockopt(zmq.LINGER, 0)
        junk.connect(pub.replay_endpoint)
        await junk.send_multipart([b"", b"x" * 100_000])  # over its size limit: dropped
        await junk.send_multipart([b"", b"short"])  # not 8 bytes: ignored
        junk.close()
        feed, index = feed_of(pub, ctx)
        await feed.take(frames(pub, 0))
        await feed.take(frames(pub, 3))  # the gap is still replayed for others
        assert feed.status.replayed == 1
        assert index.matches(IDS, ["b"], 0.0) == {"b": 8}


async def test_a_batch_that_breaks_the_index_is_counted_and_the_feed_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with publisher() as pub:
        feeds = KvEventFeeds(time.time)
        feeds.follow("m", "b", KvEventsConfig(endpoint=pub.endpoint))
        index = feeds.index("m")
        assert index is not None
        applied = index.apply
        broken = [True]

        def apply_once_broken(backend_id: str, events: Any) -> None:
            if broken[0]:
                broken[0] = False
                raise RuntimeError("a bug")
            applied(backend_id, events)

        index.apply = apply_once_broken  # type: ignore[method-assign]
        feeds.start()
        try:

            def heard() -> bool:
                pub.cleared()
                return index.follows("b")

            assert await eventually(heard)  # the first batch broke; the next ones applied
            (status,) = feeds.status()
            assert status.undecodable == 1
            assert caplog.text.count("applying a KV-event batch from b failed") == 1
        finally:
            await feeds.close()
