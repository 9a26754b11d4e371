"""The gateway's region's share of its own traffic (routing/regions.py) and how the `locality`
filter applies it: spillover with hysteresis, failover, the held and gradual return, warm
standbys, the per-tenant opt-out, and residency kept through all of them. Time is the `now`
each call is given."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest

from fleetgate.fleet.backend import Backend, BackendState, HealthFlag
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.fleet.pool import Pool
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import CandidateLoads
from fleetgate.routing.locality import Locality, LocalityParams, Place
from fleetgate.routing.regions import LocalRegion, Phase, RecoveryParams, SpillParams
from fleetgate.routing.registry import PluginContext, PluginSpec, Profile, default_registry
from fleetgate.routing.router import Router

SPILL = SpillParams(after_s=1.0, rate=0.5, fall=0.05, calm=0.5)
RECOVERY = RecoveryParams(hold_s=10.0, shift_s=30.0)


def region(standby_at: float = 0.25) -> LocalRegion:
    return LocalRegion(SPILL, RECOVERY, standby_at)


# -- LocalRegion: spillover -------------------------------------------------------------------


def test_the_spill_grows_with_the_overload_holds_in_the_band_and_falls_slowly() -> None:
    r = region()
    r.update(4, 0.0, 0.0)
    assert (r.spill, r.keep) == (0.0, 1.0)
    r.update(4, 2.0, 1.0)  # twice the wait it spills at: +rate x 1 x 1 s
    assert r.spill == pytest.approx(0.5)
    r.update(4, 1.5, 2.0)  # half over: +0.25
    assert r.spill == pytest.approx(0.75)
    assert r.keep == pytest.approx(0.25)
    for t in range(3, 13):  # within [calm, after]: holds, however long
        r.update(4, 0.6 if t % 2 else 0.99, float(t))
    assert r.spill == pytest.approx(0.75)
    r.update(4, 0.1, 14.0)  # calm for 2 s: -fall x 2
    assert r.spill == pytest.approx(0.65)


def test_the_spill_is_bounded_and_a_huge_wait_counts_as_three_times() -> None:
    r = region()
    r.update(4, 0.0, 0.0)
    r.update(4, 100.0, 0.5)  # overload capped at 2 over: +0.5 x 2 x 0.5
    assert r.spill == pytest.approx(0.5)
    r.update(4, 100.0, 5.0)
    assert (r.spill, r.keep) == (1.0, 0.0)
    r.update(4, 0.0, 105.0)
    assert r.spill == 0.0


def test_no_spill_when_it_is_off() -> None:
    r = LocalRegion(SpillParams(enabled=False), RECOVERY)
    r.update(4, 0.0, 0.0)
    r.update(4, 50.0, 10.0)
    assert (r.spill, r.keep, r.standbys) == (0.0, 1.0, False)


# -- LocalRegion: failover and return ---------------------------------------------------------


def test_a_region_down_holds_then_takes_its_traffic_back_gradually() -> None:
    r = region()
    r.update(4, 0.0, 0.0)
    r.update(2, 0.0, 100.0)  # two lost
    r.update(0, 0.0, 100.8)  # the rest: down, 0.8 s after the first loss
    assert (r.phase, r.keep, r.failovers) == (Phase.DOWN, 0.0, 1)
    assert r.last_failover_s == pytest.approx(0.8)
    r.update(4, 0.0, 200.0)
    assert (r.phase, r.keep) == (Phase.HOLDING, 0.0)
    r.update(4, 0.0, 209.9)
    assert r.keep == 0.0
    r.update(4, 0.0, 210.0)  # held 10 s: returning
    assert r.phase is Phase.RETURNING
    r.update(4, 0.0, 225.0)
    assert r.keep == pytest.approx(0.5)
    r.update(4, 0.0, 240.0)
    assert (r.phase, r.keep) == (Phase.UP, 1.0)


def test_a_relapse_while_holding_starts_the_hold_again_and_is_not_a_second_failover() -> None:
    r = region()
    r.update(2, 0.0, 0.0)
    r.update(0, 0.0, 1.0)
    r.update(2, 0.0, 5.0)
    r.update(0, 0.0, 9.0)  # down again before the hold ended
    assert (r.phase, r.failovers) == (Phase.DOWN, 1)
    r.update(2, 0.0, 12.0)
    r.update(2, 0.0, 21.9)
    assert r.phase is Phase.HOLDING  # the hold counts from its last return
    r.update(2, 0.0, 22.0)
    assert r.phase is Phase.RETURNING


def test_losing_some_backends_is_not_a_failover() -> None:
    r = region()
    r.update(4, 0.0, 0.0)
    r.update(1, 0.0, 1.0)
    r.update(3, 0.0, 2.0)
    assert (r.phase, r.keep, r.failovers) == (Phase.UP, 1.0, 0)


# -- LocalRegion: standbys ----------------------------------------------------------------------


def test_standbys_join_at_their_spill_share_and_leave_after_a_calm_hold() -> None:
    r = region(standby_at=0.25)
    r.update(4, 0.0, 0.0)
    r.update(4, 1.4, 1.0)  # +0.2
    assert not r.standbys
    r.update(4, 1.4, 2.0)  # 0.4
    assert r.standbys
    r.update(4, 0.0, 10.0)  # falls 0.4 in 8 s: 0 at 10
    assert r.spill == 0.0 and r.standbys
    r.update(4, 0.0, 19.9)
    assert r.standbys
    r.update(4, 0.0, 20.0)  # calm for hold_s
    assert not r.standbys


# -- the locality filter ----------------------------------------------------------------------


def fleet(*places: tuple[str, bool]) -> tuple[BackendState, ...]:
    """Backends in (region, standby)."""
    states = []
    for i, (where, standby) in enumerate(places):
        labels = {"region": where, **({"standby": "true"} if standby else {})}
        backend = Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",), labels=labels)
        states.append(BackendState(backend))
    return tuple(states)


def request(stays: bool = False) -> RoutingRequest:
    r = RoutingRequest("m", "chat", True, prompt=b"x" * 400)
    r.stays = stays
    return r


class Setup:
    """A Locality in `eu` over a pool, with its board to load the backends."""

    def __init__(self, states: tuple[BackendState, ...], **params: object) -> None:
        self.states = states
        self.board = MemoryLoadBoard()
        locality_params = LocalityParams(
            spill=SPILL,
            recovery=RECOVERY,
            **params,  # type: ignore[arg-type]
        )
        self.locality = Locality(
            locality_params, Place("eu"), random.Random(7), CandidateLoads(self.board)
        )
        self.members: Sequence[BackendState] = states
        self.locality.watch(lambda: self.members, lambda: self.members)

    def saturate(self, state: BackendState, wait_s: float) -> None:
        """`state` measured at 1 ms a prefilled token with `wait_s` worth of prompt waiting."""
        state.latency.prefill_s_per_token = 0.001
        self.board.begin(state.backend.id, round(wait_s * 1000))

    def regions(self, now: float, n: int = 400, stays: bool = False) -> Counter[str]:
        picks: Counter[str] = Counter()
        for _ in range(n):
            tier = self.locality.filter(request(stays), self.members, now)
            picks[tier[0].backend.labels["region"]] += 1  # (a tier is in one region)
        return picks

    def share_out(self, now: float, n: int = 2000) -> float:
        picks = self.regions(now, n)
        return 1.0 - picks["eu"] / sum(picks.values())


def test_a_saturated_region_spills_its_share_to_the_nearest_other_region() -> None:
    s = Setup(fleet(("eu", False), ("eu", False), ("us", False)))
    assert s.share_out(0.0) == 0.0
    s.saturate(s.states[0], 2.0)
    s.saturate(s.states[1], 3.0)  # the least wait counts: 2 s, twice the spill point
    assert s.share_out(1.0) == pytest.approx(0.5, abs=0.05)
    assert s.locality.local.spilled == pytest.approx(1000, abs=100)


def test_a_tenant_that_opted_out_stays_in_its_region() -> None:
    s = Setup(fleet(("eu", False), ("us", False)))
    s.regions(0.0)
    s.saturate(s.states[0], 5.0)
    s.regions(1.0)
    assert s.locality.local.keep == 0.0
    assert s.regions(1.5, stays=True) == Counter({"eu": 400})
    assert s.regions(1.5) == Counter({"us": 400})


def test_a_region_down_sends_all_out_and_its_return_waits_then_ramps() -> None:
    s = Setup(fleet(("eu", False), ("eu", False), ("us", False)))
    assert s.regions(0.0) == Counter({"eu": 400})
    s.members = s.states[2:]  # eu's backends out of rotation
    assert s.regions(1.0) == Counter({"us": 400})
    assert s.locality.local.phase is Phase.DOWN
    s.members = s.states  # back
    assert s.regions(2.0, stays=True) == Counter({"eu": 400})  # an opted-out one may use it
    assert s.regions(2.0) == Counter({"us": 400})  # the others wait out the hold
    s.regions(12.0)
    assert s.share_out(27.0) == pytest.approx(0.5, abs=0.05)  # half way through the shift
    assert s.share_out(42.0) == 0.0


def test_standbys_serve_only_when_their_region_needs_them() -> None:
    s = Setup(fleet(("eu", False), ("eu", True), ("us", False), ("us", True)))
    assert s.regions(0.0) == Counter({"eu": 400})
    assert {b.backend.id for b in s.locality.filter(request(), s.states, 0.5)} == {"b0"}
    s.members = s.states[1:]  # eu's primary down: its standby serves, no failover
    assert {b.backend.id for b in s.locality.filter(request(), s.members, 1.0)} == {"b1"}
    assert s.locality.local.phase is Phase.UP  # its standby keeps it up
    s.members = (s.states[0], s.states[1], s.states[3])  # us has only its standby: it serves
    s.saturate(s.states[0], 10.0)
    s.locality.filter(request(), s.members, 20.0)  # eu saturated: spill, its standby joins
    assert s.locality.local.standbys
    near = s.locality.filter(request(stays=True), s.members, 20.5)
    assert {b.backend.id for b in near} == {"b0", "b1"}
    assert s.regions(20.5) == Counter({"us": 400})  # all spills (for now) to us's standby
    assert {b.backend.id for b in s.locality.filter(request(), s.members, 20.5)} == {"b3"}


def test_residency_holds_while_the_region_spills() -> None:
    states = fleet(("eu", False), ("us", False))
    pool = Pool("m", states)
    profile = Profile(filters=(PluginSpec("locality"),), scorers=((PluginSpec("queue"), 1.0),))
    ctx = PluginContext(random.Random(1), pool.board, here=Place("eu"))
    router = Router(pool, default_registry().build_profile(profile, ctx))
    states[0].latency.prefill_s_per_token = 0.001
    pool.board.begin("b0", 10_000)  # eu waits 10 s: everything that may leave, leaves
    router.pick(request(), 0.0)
    router.pick(request(), 5.0)
    pinned = request()
    pinned.regions = frozenset({"eu"})
    assert {router.pick(pinned, 5.0 + i / 100) for i in range(100)} == {states[0]}
    assert {router.pick(request(), 5.0 + i / 100) for i in range(100)} == {states[1]}


def test_the_pool_s_candidates_judge_the_region_not_a_retry_s_leftovers() -> None:
    states = fleet(("eu", False), ("us", False))
    pool = Pool("m", states)
    ctx = PluginContext(random.Random(1), pool.board, here=Place("eu"))
    profile = Profile(filters=(PluginSpec("locality"),), scorers=((PluginSpec("queue"), 1.0),))
    router = Router(pool, default_registry().build_profile(profile, ctx))
    assert router.pick_other(request(), 0.0, tried=[states[0]]) is states[1]
    assert router.pick(request(), 0.1) is states[0]  # eu is not down: it was only tried
    states[0].flags |= HealthFlag.EJECTED
    pool.refresh(2.0)
    assert router.pick(request(), 2.0) is states[1]


def test_a_retry_goes_to_a_region_not_tried_while_residency_allows_one() -> None:
    states = fleet(("eu", False), ("eu", False), ("us", False))
    pool = Pool("m", states)
    profile = Profile(filters=(PluginSpec("locality"),), scorers=((PluginSpec("queue"), 1.0),))
    ctx = PluginContext(random.Random(1), pool.board, here=Place("eu"))
    router = Router(pool, default_registry().build_profile(profile, ctx))
    tried = [states[0]]
    assert router.pick_other(request(), 0.0, tried) is states[1]  # a hedge: the nearest
    assert router.pick_other(request(), 0.0, tried, elsewhere=True) is states[2]
    pinned = request()
    pinned.regions = frozenset({"eu"})
    assert router.pick_other(pinned, 0.0, tried, elsewhere=True) is states[1]


def test_a_region_whose_backends_are_all_full_is_busy_not_down() -> None:
    eu = Backend("b0", "http://127.0.0.1:8100", ("m",), labels={"region": "eu"}, max_in_flight=1)
    us = Backend("b1", "http://127.0.0.1:8101", ("m",), labels={"region": "us"})
    states = (BackendState(eu), BackendState(us))
    pool = Pool("m", states)
    profile = Profile(filters=(PluginSpec("locality"),), scorers=((PluginSpec("queue"), 1.0),))
    ctx = PluginContext(random.Random(1), pool.board, here=Place("eu"))
    router = Router(pool, default_registry().build_profile(profile, ctx))
    assert router.pick(request(), 0.0) is states[0]
    pool.begin("b0", 0.0, 10)  # at its max_in_flight: out of the candidates
    assert router.pick(request(), 0.5) is states[1]
    locality = router.pipeline.filters[0]
    assert isinstance(locality, Locality)
    assert locality.local.phase is Phase.UP and locality.local.failovers == 0


def test_a_large_pool_is_judged_once_a_second_not_on_every_shortlist() -> None:
    states = fleet(*[("eu", False)] * 20, *[("us", False)] * 20)
    pool = Pool("m", states)
    profile = Profile(filters=(PluginSpec("locality"),), scorers=((PluginSpec("queue"), 1.0),))
    ctx = PluginContext(random.Random(1), pool.board, here=Place("eu"))
    router = Router(pool, default_registry().build_profile(profile, ctx))
    locality = router.pipeline.filters[0]
    assert isinstance(locality, Locality)
    judged: list[float] = []
    judge = locality._judge
    locality._judge = lambda c, now: (judged.append(now), judge(c, now))[1]  # type: ignore[method-assign]
    for i in range(50):  # each pick scores a new shortlist of the 40
        assert router.pick(request(), 0.5 + i / 100).backend.labels["region"] == "eu"
    assert len(judged) == 1
    states[0].flags |= HealthFlag.EJECTED
    pool.refresh(1.2)  # a health change: judged again at the next pick
    router.pick(request(), 1.2)
    assert judged == [0.5, 1.2]
