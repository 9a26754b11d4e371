"""The simulator's Redis (simulate/redis.py) answers the shared routing state's commands as
Redis does: the load board's leases, lapsing after their TTL, and the decision streams."""

from __future__ import annotations

from fleetgate.clock import LoopClock
from fleetgate.shared.lease import RELEASE_SCRIPT, RENEW_SCRIPT
from fleetgate.shared.load_board import LEAVE_SCRIPT, SYNC_SCRIPT
from fleetgate.simulate.redis import SimRedis


class Frozen(LoopClock):
    """A clock that reads `t`, set by the test."""

    def __init__(self) -> None:
        self.t = 0.0
        super().__init__(lambda: self.t)


def sync(redis: SimRedis, me: str, *fields: str, ttl_ms: int = 2000) -> object:
    return redis.run("EVAL", SYNC_SCRIPT, 2, "b:gateways", "b:lease:", me, ttl_ms, *fields)


def test_a_gateway_reads_the_others_leases_until_they_lapse() -> None:
    clock = Frozen()
    redis = SimRedis(clock)
    assert sync(redis, "a", "b1", "2 100 50") == [1, []]
    assert sync(redis, "b", "b1", "1 10 0") == [2, [[b"b1", b"2 100 50"]]]
    clock.t = 1.0
    assert sync(redis, "a") == [2, [[b"b1", b"1 10 0"]]]  # a's own counts: none now
    clock.t = 3.5  # b's lease (2 s from t=0) lapsed; a's (from t=1) too
    assert sync(redis, "b", "b2", "1 1 1") == [1, []]


def test_a_gateway_that_leaves_is_not_counted_at_once() -> None:
    redis = SimRedis(Frozen())
    sync(redis, "a", "b1", "1 1 1")
    redis.run("EVAL", LEAVE_SCRIPT, 2, "b:gateways", "b:lease:", "a")
    assert sync(redis, "b") == [1, []]


def test_stream_entries_are_read_after_the_last_one_read_and_trimmed() -> None:
    redis = SimRedis(Frozen())
    first = redis.run("XADD", "s", "MAXLEN", "~", 2, "*", "g", "a", "r", "x")
    redis.run("XADD", "s", "MAXLEN", "~", 2, "*", "g", "b", "r", "y")
    ((key, entries),) = redis.run("XREAD", "COUNT", 10, "STREAMS", "s", first)
    assert key == b"s" and [e[1] for e in entries] == [{b"g": b"b", b"r": b"y"}]
    redis.run("XADD", "s", "MAXLEN", "~", 2, "*", "g", "c", "r", "z")
    ((_, entries),) = redis.run("XREAD", "COUNT", 10, "STREAMS", "s", b"0")
    assert [e[1][b"g"] for e in entries] == [b"a", b"b", b"c"]  # trimmed past 2 x keep only
    assert redis.run("XREAD", "COUNT", 10, "STREAMS", "s", entries[-1][0]) == []


def test_a_lease_has_one_holder_until_it_lapses_or_is_released() -> None:
    clock = Frozen()
    redis = SimRedis(clock)

    def renew(holder: str) -> object:
        return redis.run("EVAL", RENEW_SCRIPT, 1, "lease", holder, "2000")

    assert (renew("a"), renew("b"), renew("a")) == (1, 0, 1)
    clock.t = 1.9
    assert renew("b") == 0  # a renewed at 0: held until 2.0
    clock.t = 2.5
    assert renew("b") == 1  # lapsed
    assert redis.run("EVAL", RELEASE_SCRIPT, 1, "lease", "a") == 0  # not a's to give up
    assert redis.run("EVAL", RELEASE_SCRIPT, 1, "lease", "b") == 1
    assert renew("a") == 1


def test_a_stream_is_trimmed_to_about_its_length_as_maxlen_tilde_does() -> None:
    redis = SimRedis(Frozen())
    for i in range(5):
        redis.run("XADD", "s", "MAXLEN", "~", 2, "*", "g", "a", "r", str(i))
    ((_, entries),) = redis.run("XREAD", "COUNT", 10, "STREAMS", "s", b"0")
    assert 2 <= len(entries) <= 4 and entries[-1][1][b"r"] == b"4"
