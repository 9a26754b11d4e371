"""Deterministic stand-ins for what a model samples: where a stop sequence cuts an answer and
each token's log-probabilities.

Log-probabilities, for the token at `position` of the sequence drawn from `seed`: the chosen
token has probability p0 = 0.4 + 0.55 * u (u in [0, 1] from a hash of seed and position), the
j-th alternative (j >= 1) (1 - p0) * 2^-j. So the chosen token is always the likeliest and first
in its top list, every logprob is below 0 and the probabilities never sum past 1. Alternatives
are filler words other than the chosen token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from fleetgate.tokens import FILLER_WORDS

MAX_TOP_LOGPROBS = 20  # vLLM's default max_logprobs
_BLOCK = 512  # tokens made and searched at a time when looking for a stop sequence
_MASK = 0xFFFFFFFFFFFFFFFF


def cut_at_stop(piece: Callable[[int], str], count: int, stops: Sequence[str]) -> list[str] | None:
    """The visible text of each token up to where the first stop sequence ends, or None if no
    stop sequence occurs within `count` tokens.

    Generation stops at the token that completes a stop sequence (the first to be completed);
    the text from the start of that stop sequence on is not shown, so the pieces of the last
    tokens may be cut short or empty. Text is searched a block of tokens at a time (str.find),
    not token by token."""
    longest = max(len(s) for s in stops)
    pieces: list[str] = []
    text = ""
    for start in range(0, count, _BLOCK):
        block = [piece(i) for i in range(start, min(count, start + _BLOCK))]
        search_from = max(0, len(text) - longest + 1)
        pieces.extend(block)
        text += "".join(block)
        found = [(at + len(s), at) for s in stops if (at := text.find(s, search_from)) >= 0]
        if found:
            end, at = min(found)
            return _clip(pieces, end, at)
    return None


def _clip(pieces: list[str], end: int, at: int) -> list[str]:
    """The pieces up to the one holding character `end - 1`, showing only text before `at`."""
    out: list[str] = []
    offset = 0
    for p in pieces:
        out.append(p[: max(0, at - offset)])
        offset += len(p)
        if offset >= end:
            break
    return out


def _mix(seed: int, position: int) -> int:
    h = (seed * 0xD6E8FEB86659FD93 + position * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK
    h ^= h >> 32
    h = (h * 0xD6E8FEB86659FD93) & _MASK
    return h ^ (h >> 29)


def token_logprobs(
    token: str, seed: int, position: int, top: int
) -> tuple[float, list[tuple[str, float]]]:
    """The token's logprob and the `top` likeliest tokens with theirs, the token first (see
    the module docstring)."""
    h = _mix(seed, position)
    p0 = 0.4 + 0.55 * ((h & 0xFFFF) / 0xFFFF)
    chosen = math.log(p0)
    ranked = [(token, chosen)] if top else []
    rest = 1.0 - p0
    start = (h >> 16) % len(FILLER_WORDS)
    j = 0
    while len(ranked) < top:
        word = " " + FILLER_WORDS[(start + j) % len(FILLER_WORDS)]
        j += 1
        if word != token:
            ranked.append((word, math.log(rest * 2.0 ** -len(ranked))))
    return chosen, ranked
