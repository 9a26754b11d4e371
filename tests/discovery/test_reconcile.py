"""The reconciler over real pools and membership: what sources say becomes who is routed to,
probed first, drained when not ready, retired when gone, and kept when a source fails."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import pytest

from fleetgate.discovery.found import Found, SourceError
from fleetgate.discovery.reconcile import Discovery
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.membership import Joining, Membership
from fleetgate.fleet.pool import Pool
from fleetgate.health.active import ActiveCheckSettings, ProbeTracker

MODEL = "m"
A = "http://127.0.0.1:9001"
B = "http://127.0.0.1:9002"
CONFIGURED = "http://127.0.0.1:9000"


class Probes:
    """Stands for health/probes.py: records whom it would probe (probing is not tested here)."""

    def __init__(self, probing: bool) -> None:
        self.probing = probing
        self.watched: list[BackendState] = []

    def probes(self, pool: Pool) -> bool:
        return self.probing

    def watch(self, pool: Pool, state: BackendState) -> None:
        self.watched.append(state)

    def forget(self, state: BackendState) -> None:
        self.watched.remove(state)


class Listed:
    """A source that says what the test sets, or fails."""

    def __init__(self, name: str = "listed") -> None:
        self.name = name
        self.interval_s = 1.0
        self.backends: list[Found] = []
        self.broken: str | None = None

    async def read(self) -> Sequence[Found]:
        if self.broken is not None:
            raise SourceError(self.broken)
        return self.backends


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fleet(probing: bool = True) -> tuple[Pool, Probes, Clock, Membership]:
    configured = BackendState(Backend(CONFIGURED[7:], CONFIGURED, (MODEL,)))
    pool = Pool(MODEL, [configured])
    probes, clock = Probes(probing), Clock()
    return pool, probes, clock, Membership({MODEL: pool}, clock, probes)


async def found_by(members: Membership, *found: Found) -> tuple[Listed, Discovery]:
    """A source that has said `found`, and the discovery that read it once."""
    source = Listed()
    discovery = Discovery(members, [source])
    source.backends = list(found)
    await discovery.poll(source)
    return source, discovery


def member(pool: Pool, url: str) -> BackendState | None:
    return pool.members.get(url[7:])


async def test_a_found_backend_takes_nothing_until_a_probe_passes_then_ramps_up() -> None:
    """An engine loading its model fails its first probes; the first good one lets it in at
    the start of its slow start, however long it took, its start-up failures forgotten."""
    pool, probes, clock, members = fleet()
    await found_by(members, Found(model=MODEL, url=A, weight=2.0))
    state = member(pool, A)
    assert state is not None and state in probes.watched
    assert state.flags == HealthFlag.UNPROBED and state not in pool.candidates
    tracker = ProbeTracker(ActiveCheckSettings(unhealthy_threshold=1), state)
    tracker.record(False, 1.0)  # loading
    assert state.flags == HealthFlag.UNPROBED | HealthFlag.ACTIVE_CHECK_FAILED
    clock.now = 100.0  # past the pool's 30 s slow start
    pool.update(clock.now)
    assert tracker.record(True, clock.now)  # one good probe
    pool.update(clock.now)
    assert state.flags == HealthFlag(0) and state in pool.candidates
    assert state.weight < 2.0 * 0.2  # its slow start's first share
    clock.now = 1000.0
    pool.update(clock.now)
    assert state.weight == 2.0


async def test_a_pool_that_probes_nothing_routes_a_found_backend_at_once() -> None:
    pool, _, _, members = fleet(probing=False)
    await found_by(members, Found(model=MODEL, url=A))
    state = member(pool, A)
    assert state is not None and state in pool.candidates and state.ramp_from == 0.0


async def test_a_backend_gone_from_its_source_is_retired_and_one_not_ready_drained() -> None:
    pool, _, _, members = fleet(probing=False)
    source, discovery = await found_by(
        members, Found(model=MODEL, url=A), Found(model=MODEL, url=B)
    )
    b = member(pool, B)
    assert b is not None
    pool.board.begin(b.backend.id, 10)  # a request in flight on B
    source.backends = [Found(model=MODEL, url=A, ready=False)]
    await discovery.poll(source)
    a = member(pool, A)
    assert a is not None and a.flags == HealthFlag.DRAINING
    assert b.flags & HealthFlag.GONE and pool.retiring(b)  # drains, then leaves
    assert pool.candidates == (pool.members[CONFIGURED[7:]],)
    source.backends = [Found(model=MODEL, url=A)]
    await discovery.poll(source)
    assert a.flags == HealthFlag(0) and a in pool.candidates


async def test_a_failing_source_keeps_its_last_good_set_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool, _, _, members = fleet(probing=False)
    source = Listed("dns:x")
    discovery = Discovery(members, [source])
    source.backends = [Found(model=MODEL, url=A)]
    await discovery.poll(source)
    source.broken = "server unreachable"
    with caplog.at_level(logging.WARNING, "fleetgate.discovery"):
        for _ in range(3):
            await discovery.poll(source)
    assert member(pool, A) is not None and not member(pool, A).flags  # type: ignore[union-attr]
    (status,) = discovery.statuses()
    assert (status.up, status.backends, status.failures) == (False, 1, 3)
    assert [r.getMessage() for r in caplog.records] == [
        "discovery: dns:x failed, its last good set kept: server unreachable"
    ]
    source.broken = None
    source.backends = []  # an answer: what it added leaves
    await discovery.poll(source)
    assert member(pool, A) is None and discovery.statuses()[0].up


async def test_configured_backends_and_unknown_models_are_left_alone() -> None:
    pool, _, _, members = fleet(probing=False)
    source, discovery = await found_by(
        members, Found(model=MODEL, url=CONFIGURED), Found(model="other", url=A)
    )
    assert [s.backend.id for s in pool.states] == [CONFIGURED[7:]]
    source.backends = []
    await discovery.poll(source)
    assert not pool.members[CONFIGURED[7:]].flags  # not discovery's to retire


async def test_a_backend_stays_while_any_source_names_it() -> None:
    pool, _, _, members = fleet(probing=False)
    first, second = Listed("one"), Listed("two")
    discovery = Discovery(members, [first, second])
    first.backends = [Found(model=MODEL, url=A)]
    second.backends = [Found(model=MODEL, url=A, weight=3.0)]
    await discovery.poll(first)
    await discovery.poll(second)
    state = member(pool, A)
    assert state is not None and state.backend.weight == 1.0  # the first source's word
    first.backends = []
    await discovery.poll(first)
    assert member(pool, A) is state and state.backend.weight == 3.0  # now the second's
    second.backends = []
    await discovery.poll(second)
    assert state.flags & HealthFlag.GONE


async def test_the_operators_removal_is_followed_and_its_own_backend_never_retired() -> None:
    pool, _, _, members = fleet(probing=False)
    source, discovery = await found_by(members, Found(model=MODEL, url=A))
    found = member(pool, A)
    members.remove(A[7:], MODEL)  # the operator (admin API): gone at once, nothing in flight
    assert member(pool, A) is None
    await discovery.poll(source)  # still listed: found anew, a new member
    again = member(pool, A)
    assert again is not None and again is not found
    members.remove(A[7:], MODEL)
    mine = members.add(MODEL, Joining(url=A))  # the operator's own, now
    source.backends = []
    await discovery.poll(source)
    assert member(pool, A) is mine and not mine.flags  # not discovery's to retire


def test_two_sources_with_one_name_are_refused() -> None:
    _, _, _, members = fleet()
    with pytest.raises(ValueError, match="two discovery sources read the same thing: x"):
        Discovery(members, [Listed("x"), Listed("x")])


@pytest.mark.parametrize(
    ("url", "says"),
    [("10.0.0.5:8000", "must be http(s)://HOST:PORT"), ("http://h", "must be http(s)://HOST:PORT"),
     ("http://u:pw@h:80", "must not hold a user or password"),
     ("http://h:80/?x=1", "no query or fragment")],
)  # fmt: skip
def test_a_found_url_is_checked_as_the_admin_api_checks_one(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)) as refused:
        Found(model=MODEL, url=url)
    assert "pw" not in str(refused.value)
