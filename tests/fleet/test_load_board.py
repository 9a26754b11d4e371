"""The load board (fleet/load_board.py): each backend's in-flight requests, their prompt tokens
and the prompt tokens awaiting prefill, by backend id, as the LoadBoard protocol promises them;
and a pool counting on it."""

from __future__ import annotations

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.load_board import LoadBoard, MemoryLoadBoard
from fleetgate.fleet.pool import Pool


def test_begin_prefilled_and_end_count_requests_and_tokens_by_id() -> None:
    board: LoadBoard = MemoryLoadBoard()
    after = board.begin("10.0.0.1:8000", 500)
    board.begin("10.0.0.1:8000", 300)
    board.begin("10.0.0.2:8000", 50)
    load = board.load("10.0.0.1:8000")
    assert after is load  # the record itself, current in place
    assert (load.in_flight, load.in_flight_tokens, load.pending_prefill) == (2, 800, 800)
    board.prefilled("10.0.0.1:8000", 500)  # the first one's first token came back
    assert (load.in_flight, load.in_flight_tokens, load.pending_prefill) == (2, 800, 300)
    board.end("10.0.0.1:8000", 500, 0)
    ended = board.end("10.0.0.1:8000", 300, 300)  # failed before its first token
    assert ended is load
    assert (load.in_flight, load.in_flight_tokens, load.pending_prefill) == (0, 0, 0)
    other = board.load("10.0.0.2:8000")
    assert (other.in_flight, other.in_flight_tokens, other.pending_prefill) == (1, 50, 50)
    assert board.loads(["10.0.0.2:8000", "10.0.0.1:8000"]) == [other, load]  # in that order


def test_a_backend_never_seen_reads_zero_and_forget_drops_a_record() -> None:
    board = MemoryLoadBoard()
    unseen = board.load("nowhere:1")
    assert (unseen.in_flight, unseen.in_flight_tokens, unseen.pending_prefill) == (0, 0, 0)
    assert board.load("nowhere:1") is unseen  # the same record until forgotten
    board.begin("b", 10)
    board.end("b", 10, 10)
    board.forget("b")
    board.forget("never there")  # nothing to drop: no error
    assert len(board) == 1  # "nowhere:1" only
    assert board.load("b").in_flight == 0


def test_a_pool_counts_on_the_board_it_is_given_and_forgets_a_backend_that_left() -> None:
    board = MemoryLoadBoard()
    states = [
        BackendState(Backend(f"b{i}", f"http://127.0.0.1:{9100 + i}", ("m",))) for i in (0, 1)
    ]
    pool = Pool("m", states, board=board)
    pool.begin("b0", 0.0, prompt_tokens=100)
    assert board.load("b0").in_flight == 1 and pool.in_flight == 1
    assert [(s.backend.id, load.in_flight) for s, load in pool.loads()] == [("b0", 1), ("b1", 0)]
    assert not pool.retire(states[0], 1.0)  # a request in flight: it stays until it ends
    pool.end("b0", 2.0, prompt_tokens=100, unprefilled=100)
    assert pool.members == {"b1": states[1]}
    assert len(board) == 1  # b0's record went with it
