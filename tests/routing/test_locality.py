"""`locality`: a request stays in the gateway's zone, else its region, else the region that
answered soonest, else the backends with no region; a gateway that knows no region keeps all."""

from __future__ import annotations

import random
from collections import Counter

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import CandidateLoads
from fleetgate.routing.locality import Locality, LocalityParams, Place
from fleetgate.routing.registry import PluginContext, PluginSpec, Profile, default_registry

REQUEST = RoutingRequest("m", "chat", True, prompt=b"hi")


def placed(*places: tuple[str | None, str | None]) -> tuple[BackendState, ...]:
    states = []
    for i, (region, zone) in enumerate(places):
        labels = {k: v for k, v in (("region", region), ("zone", zone)) if v is not None}
        backend = Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",), labels=labels)
        states.append(BackendState(backend))
    return tuple(states)


FLEET = placed(("eu", "eu-a"), ("eu", "eu-b"), ("us", "us-a"), ("ap", "ap-a"), (None, None))


def locality(here: Place, params: LocalityParams | None = None) -> Locality:
    loads = CandidateLoads(MemoryLoadBoard())
    return Locality(params or LocalityParams(), here, random.Random(0), loads)


def kept(here: Place, candidates: tuple[BackendState, ...], prefer_zone: bool = True) -> set[str]:
    chosen = locality(here, LocalityParams(prefer_zone=prefer_zone)).filter(REQUEST, candidates, 0)
    return {s.backend.id for s in chosen}


def test_the_zone_then_the_region() -> None:
    assert kept(Place("eu", "eu-b"), FLEET) == {"b1"}
    assert kept(Place("eu", "eu-b"), FLEET, prefer_zone=False) == {"b0", "b1"}
    assert kept(Place("eu", "eu-c"), FLEET) == {"b0", "b1"}  # no candidate in its zone
    assert kept(Place("eu"), FLEET) == {"b0", "b1"}  # its zone unknown
    assert kept(Place("eu", "eu-b"), (FLEET[0], *FLEET[2:])) == {"b0"}  # its zone's one gone


def test_elsewhere_the_region_that_answered_soonest_then_the_unlabelled() -> None:
    away = FLEET[2:]  # us, ap, and one with no region
    assert kept(Place("eu", "eu-a"), away) in ({"b2"}, {"b3"})  # none measured: either
    away[0].latency.record_stream(ttft_s=0.08, e2e_s=1.0, tokens=10)  # us
    away[1].latency.record_stream(ttft_s=0.30, e2e_s=1.0, tokens=10)  # ap
    assert kept(Place("eu", "eu-a"), away) == {"b2"}
    assert kept(Place("eu", "eu-a"), away[2:]) == {"b4"}


def test_a_gateway_that_knows_no_region_keeps_every_candidate() -> None:
    assert kept(Place(), FLEET) == {f"b{i}" for i in range(5)}


def test_a_profile_routes_within_the_tier_its_filter_keeps() -> None:
    profile = Profile(filters=(PluginSpec("locality"),), scorers=((PluginSpec("queue"), 1.0),))
    ctx = PluginContext(random.Random(1), MemoryLoadBoard(), here=Place("us", "us-a"))
    pipeline = default_registry().build_profile(profile, ctx)
    picks = Counter(pipeline.pick(REQUEST, FLEET, 0.0) for _ in range(20))
    assert picks == Counter({FLEET[2]: 20})


def test_in_a_pool_larger_than_the_shortlist_the_pool_s_nearest_tier_is_kept() -> None:
    pool = placed(*[("us", "us-a")] * 95, *[("eu", "eu-a")] * 5)
    profile = Profile(filters=(PluginSpec("locality"),), scorers=((PluginSpec("queue"), 1.0),))
    ctx = PluginContext(random.Random(3), MemoryLoadBoard(), here=Place("eu", "eu-a"))
    pipeline = default_registry().build_profile(profile, ctx)
    picks = Counter(pipeline.pick(REQUEST, pool, 0.0) for _ in range(200))
    assert set(picks) == set(pool[95:])  # every pick local, and spread over all five


def test_a_list_filtered_again_is_the_same_list_until_it_changes() -> None:
    near = locality(Place("eu", "eu-a"))
    first = near.filter(REQUEST, FLEET, 0.0)
    assert near.filter(REQUEST, FLEET, 0.5) is first  # pickers index it by identity
    assert near.filter(REQUEST, FLEET[1:], 0.5) is not first


def test_a_gateway_that_knows_its_region_routes_every_policy_by_locality() -> None:
    ctx = PluginContext(random.Random(1), MemoryLoadBoard(), here=Place("us", "us-a"))
    for policy in ("round_robin", "least_loaded", "prefix_cache"):
        pipeline = default_registry().build_pipeline(policy, {}, ctx)
        assert {pipeline.pick(REQUEST, FLEET, 0.0) for _ in range(10)} == {FLEET[2]}
    nowhere = PluginContext(random.Random(1), MemoryLoadBoard())
    pipeline = default_registry().build_pipeline("round_robin", {}, nowhere)
    assert {pipeline.pick(REQUEST, FLEET, 0.0) for _ in range(10)} == set(FLEET)


def test_the_nearest_region_is_the_one_whose_probes_come_back_soonest_whatever_its_load() -> None:
    away = placed(("us", "us-a"), ("ap", "ap-a"))
    away[0].latency.record_stream(ttft_s=0.50, e2e_s=1.0, tokens=10)  # us: busy, near
    away[1].latency.record_stream(ttft_s=0.08, e2e_s=1.0, tokens=10)  # ap: idle, far
    assert kept(Place("eu", "eu-a"), away) == {"b1"}  # by TTFT while no probe came back
    away[0].latency.record_probe(0.002)
    away[1].latency.record_probe(0.090)
    assert kept(Place("eu", "eu-a"), away) == {"b0"}
