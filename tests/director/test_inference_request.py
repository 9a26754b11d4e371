"""director/request.py: what a request's metadata may change of its lifecycle."""

from __future__ import annotations

import pytest

from fleetgate.director.request import queue_timeout, request_timeouts
from fleetgate.traffic.door import Refused
from fleetgate.upstream.timeouts import Timeouts


def test_a_timeout_header_may_shorten_the_pool_s_timeouts_never_lengthen_them() -> None:
    pool = Timeouts(first_byte_s=10.0, total_s=100.0, idle_s=5.0)
    headers = {
        b"x-fleetgate-first-byte-timeout-s": b"2.5",
        b"x-fleetgate-total-timeout-s": b"1e300",  # clamped to the pool's, silently
        b"x-fleetgate-idle-timeout-s": b"5.0",
    }
    got = request_timeouts(pool, headers)
    assert (got.first_byte_s, got.total_s, got.idle_s, got.connect_s) == (2.5, 100.0, 5.0, 5.0)
    longer = {b"x-fleetgate-total-timeout-s": b"1e300", b"x-fleetgate-idle-timeout-s": b"60"}
    assert request_timeouts(pool, longer) is pool


def test_a_timeout_that_is_no_positive_number_is_refused_naming_its_header() -> None:
    with pytest.raises(Refused) as refused:
        request_timeouts(Timeouts(), {b"x-fleetgate-idle-timeout-s": b"soon"})
    assert (refused.value.status, refused.value.param) == (400, "x-fleetgate-idle-timeout-s")


def test_the_queue_timeout_may_only_shorten_the_tenants() -> None:
    assert queue_timeout({}, 30.0) == 30.0
    assert queue_timeout({b"x-fleetgate-queue-timeout-s": b"2"}, 30.0) == 2.0
    assert queue_timeout({b"x-fleetgate-queue-timeout-s": b"90"}, 30.0) == 30.0
    with pytest.raises(Refused, match="seconds >= 0"):
        queue_timeout({b"x-fleetgate-queue-timeout-s": b"-1"}, 30.0)
