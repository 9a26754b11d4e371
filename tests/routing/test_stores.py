"""The stores of routing state (routing/stores.py): the in-process implementations keep what
their protocols promise, by backend id; and the prefix, load and session scorers read only
through their stores (given stand-in stores, they rank by what those report, whatever the
backends' own state says)."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import BackendLoad, LoadBoard
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.least_requests import LeastRequests
from fleetgate.routing.load import CandidateLoads
from fleetgate.routing.power_of_two import PowerOfTwo
from fleetgate.routing.prefill_queue import PrefillQueue
from fleetgate.routing.prefix_cache import PrefixCacheScorer
from fleetgate.routing.prefix_index import MemoryPrefixIndex, block_hashes
from fleetgate.routing.queue import QueueScorer
from fleetgate.routing.session_affinity import SessionAffinity
from fleetgate.routing.session_table import MemorySessionTable
from fleetgate.routing.stored_responses import StoredResponses
from fleetgate.routing.stores import PrefixIndex, ResponsePins, SessionTable


def states(n: int) -> tuple[BackendState, ...]:
    return tuple(
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{8100 + i}", ("m",))) for i in range(n)
    )


# -- the in-process implementations, through their protocols ---------------------------------


def test_the_prefix_index_answers_by_backend_id_and_among_the_ids_asked() -> None:
    index: PrefixIndex = MemoryPrefixIndex(1000)
    index.record("10.0.0.1:8000", [1, 2, 3])
    index.record("10.0.0.2:8000", [1, 2])
    index.record("10.0.0.3:8000", [9])
    assert index.matches([1, 2, 3]) == {"10.0.0.1:8000": 3, "10.0.0.2:8000": 2}
    assert index.matches([1, 2, 3], among=["10.0.0.2:8000", "never seen"]) == {"10.0.0.2:8000": 2}
    assert index.matches([1, 2, 3], among=[]) == {}
    assert index.deepest([1, 2, 3], 4) == ["10.0.0.1:8000"]
    assert sorted(index.deepest([1, 2, 7], 4)) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    index.set_capacity("10.0.0.1:8000", 2)  # the oldest block sent to it goes
    assert index.capacity("10.0.0.1:8000") == 2
    assert index.matches([1]) == {"10.0.0.2:8000": 1}
    index.forget("10.0.0.2:8000")
    assert index.matches([2, 3]) == {"10.0.0.1:8000": 2}


def test_the_session_table_remembers_the_last_backend_and_forgets_the_oldest_session() -> None:
    table: SessionTable = MemorySessionTable(capacity=2)
    assert table.home("alice") is None
    table.record("alice", "b0")
    table.record("bob", "b1")
    table.record("alice", "b2")  # where her last request went, and now the most recent
    table.record("carol", "b1")  # one over: bob, the least recently sent, is forgotten
    assert (table.home("alice"), table.home("bob"), table.home("carol")) == ("b2", None, "b1")
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        MemorySessionTable(capacity=0)


def test_the_response_pins_say_which_backend_keeps_a_response_and_whose_it_is() -> None:
    pins: ResponsePins = StoredResponses(capacity=10)
    pins.record("resp_1", "10.0.0.1:8000", "acme")
    assert pins.where("resp_1") == ("10.0.0.1:8000", "acme")
    assert pins.where("resp_2") is None


# -- the scorers read through their stores ---------------------------------------------------


class ReportedLoads:
    """A load board that reports fixed loads (as a board shared by gateways would report the
    fleet's) and refuses every write: routing only reads."""

    def __init__(self, **in_flight: int) -> None:
        self._loads: dict[str, BackendLoad] = {}
        for backend, count in in_flight.items():
            load = self._loads[backend] = BackendLoad()
            load.in_flight = count
            load.pending_prefill = 1000 * count

    def load(self, backend_id: str) -> BackendLoad:
        return self._loads.setdefault(backend_id, BackendLoad())

    def loads(self, backend_ids: Iterable[str]) -> list[BackendLoad]:
        return [self.load(backend) for backend in backend_ids]

    def begin(self, backend_id: str, prompt_tokens: int) -> BackendLoad:
        raise AssertionError("routing wrote to the load board")

    def prefilled(self, backend_id: str, prompt_tokens: int) -> None:
        raise AssertionError("routing wrote to the load board")

    def end(self, backend_id: str, prompt_tokens: int, unprefilled: int) -> BackendLoad:
        raise AssertionError("routing wrote to the load board")

    def forget(self, backend_id: str) -> None:
        raise AssertionError("routing wrote to the load board")


REQUEST = RoutingRequest("m", "chat", True, session_key="alice", prompt=b"x" * 400)


def test_the_load_scorers_and_pickers_rank_by_what_the_board_reports() -> None:
    a, b, c = states(3)  # their own state says nothing of their load
    board: LoadBoard = ReportedLoads(b0=6, b1=0, b2=3)
    loads = CandidateLoads(board)
    assert QueueScorer(loads).score(REQUEST, (a, b, c), 0.0) == pytest.approx([0.0, 1.0, 0.5])
    assert PrefillQueue(loads).score(REQUEST, (a, b, c), 0.0) == pytest.approx([0.0, 1.0, 0.5])
    assert LeastRequests(random.Random(1), loads).pick(REQUEST, (a, b, c), None, 0.0) is b
    two = PowerOfTwo(random.Random(1), loads)
    assert {two.pick(REQUEST, (a, c), None, 0.0) for _ in range(20)} == {c}


class RememberedSessions:
    """A session table that knows where alice went, and notes what it is told."""

    def __init__(self, **homes: str) -> None:
        self.homes = dict(homes)

    def home(self, session: str) -> str | None:
        return self.homes.get(session)

    def record(self, session: str, backend_id: str) -> None:
        self.homes[session] = backend_id


def test_the_session_scorer_sends_a_session_where_its_table_says_while_it_has_room() -> None:
    candidates = states(4)
    sessions = RememberedSessions(alice="b2")
    scorer = SessionAffinity(CandidateLoads(ReportedLoads()), sessions=sessions)
    assert scorer.score(REQUEST, candidates, 0.0) == [0.0, 0.0, 1.0, 0.0]
    assert scorer.nominate(REQUEST, 0.0)[0] == "b2"
    scorer.chosen(REQUEST, candidates[3], 0.0)  # sent elsewhere after all: the table hears it
    assert sessions.homes == {"alice": "b3"}
    # b3 full by the board's count (3 in flight, the bound ceil(1.25 * (3 + 1) / 4) = 2): the
    # ring decides.
    full = SessionAffinity(CandidateLoads(ReportedLoads(b3=3)), sessions=sessions)
    assert full.score(REQUEST, candidates, 0.0)[3] == 0.0


class HeldPrefixes:
    """A prefix index that says b1 holds every prompt, and notes what is recorded."""

    def __init__(self) -> None:
        self.recorded: list[tuple[str, int]] = []

    def record(self, backend_id: str, hashes: list[int]) -> None:
        self.recorded.append((backend_id, len(hashes)))

    def matches(self, hashes: list[int], among: Iterable[str] | None = None) -> dict[str, int]:
        held = {"b1": len(hashes)}
        if among is None:
            return held
        wanted = set(among)
        return {b: d for b, d in held.items() if b in wanted}

    def deepest(self, hashes: list[int], limit: int) -> list[str]:
        return ["b1"]

    def set_capacity(self, backend_id: str, blocks: int) -> None:
        pass

    def capacity(self, backend_id: str) -> int:
        return 1 << 20

    def forget(self, backend_id: str) -> None:
        pass


def test_the_prefix_scorer_scores_what_its_index_says_each_backend_holds() -> None:
    candidates = states(3)
    index = HeldPrefixes()
    scorer = PrefixCacheScorer(CandidateLoads(ReportedLoads()), index=index)
    assert scorer.score(REQUEST, candidates, 0.0) == [0.0, 1.0, 0.0]
    assert scorer.nominate(REQUEST, 0.0) == ["b1"]
    scorer.chosen(REQUEST, candidates[2], 0.0)
    assert index.recorded == [("b2", len(block_hashes(REQUEST.prompt, 128)))]
    # Its load guard reads the board too: the holder's queue past it, the holder scores 0.
    guarded = PrefixCacheScorer(CandidateLoads(ReportedLoads(b1=40)), index=index)
    assert guarded.score(REQUEST, candidates, 0.0) == [0.0, 0.0, 0.0]
