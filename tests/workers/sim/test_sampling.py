"""Stop sequences and logprobs: what the sim's sampler promises."""

from __future__ import annotations

import math

import pytest

from fleetgate.tokens import filler_token
from fleetgate.workers.sim.sampling import cut_at_stop, token_logprobs

PIECES = [" the", " cat", " sat", " on", " the", " mat"]


def test_the_answer_ends_before_the_first_stop_sequence_to_complete() -> None:
    assert cut_at_stop(PIECES.__getitem__, 6, [" sat"]) == [" the", " cat", ""]
    # A stop text across tokens: both are generated, neither shows.
    assert cut_at_stop(PIECES.__getitem__, 6, ["at on"]) == [" the", " cat", " s", ""]
    # The first completed wins, not the first listed.
    assert cut_at_stop(PIECES.__getitem__, 6, [" mat", "cat"]) == [" the", " "]
    assert cut_at_stop(PIECES.__getitem__, 6, ["dog"]) is None
    assert cut_at_stop(PIECES.__getitem__, 2, [" sat"]) is None  # past the last token


def test_a_stop_sequence_is_found_across_search_blocks() -> None:
    def piece(i: int) -> str:
        return filler_token(i, 7)

    text = "".join(piece(i) for i in range(3000))
    edge = len("".join(piece(i) for i in range(1024)))  # where the second block ends
    stop = text[edge - 6 : edge + 6]
    assert text.index(stop) == edge - 6
    cut = cut_at_stop(piece, 3000, [stop])
    assert cut is not None
    assert "".join(cut) == text[: edge - 6]
    ends = [len("".join(piece(i) for i in range(n))) for n in range(1025, 1030)]
    assert len(cut) == 1025 + next(i for i, e in enumerate(ends) if e >= edge + 6)


@pytest.mark.parametrize("top", [0, 1, 5, 20])
def test_logprobs_are_valid_and_the_chosen_token_leads_its_top_list(top: int) -> None:
    for position in range(50):
        chosen, ranked = token_logprobs(" the", 3, position, top)
        assert chosen < 0
        assert len(ranked) == top
        if top:
            assert ranked[0] == (" the", chosen)
            assert [lp for _, lp in ranked] == sorted((lp for _, lp in ranked), reverse=True)
            assert len({t for t, _ in ranked}) == top
            assert sum(math.exp(lp) for _, lp in ranked) <= 1.0
    assert token_logprobs(" a", 3, 9, 4) == token_logprobs(" a", 3, 9, 4)
    assert token_logprobs(" a", 3, 9, 4) != token_logprobs(" a", 4, 9, 4)
