"""The project's one rule for counting tokens and making filler text.

No real tokenizer ships with fleetgate (loading one costs more than the sim engine's whole
step), so tokens are counted by an approximation of byte-level BPE pre-tokenization, the first
stage of the Llama-3 and cl100k tokenizers: a token is an optional leading space plus a run of
letters, a run of up to three digits, a run of punctuation, or a run of whitespace. For English
prose this lands within a few percent of what those tokenizers count, because common words are
single tokens there. Long words are split every 8 characters, as BPE splits rare words.

Filler text is built from words that are one token in both tokenizers, so a text of n filler
words counts as n tokens by this rule and, closely, by a real tokenizer too.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from xxhash import xxh32_intdigest

# Pre-tokenizer pattern, after the regex that tiktoken's cl100k_base uses.
_TOKEN_RE = re.compile(r" ?[A-Za-z]{1,8}| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+")

# Common English words that are a single token (with their leading space) in Llama-3 and cl100k.
FILLER_WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people", "new",
    "about", "some", "what", "out", "up", "into", "only", "other", "than", "then", "also", "over",
    "after", "first", "two", "most", "like", "could", "these", "may", "any", "many", "work",
    "where", "well", "long", "way", "water", "world", "year", "good", "just", "each", "state",
    "through", "made", "part", "day", "between", "small", "light", "city", "early",
)  # fmt: skip


def count_tokens(text: str) -> int:
    """Tokens in `text` by the rule in this module's docstring."""
    return len(_TOKEN_RE.findall(text))


def split_tokens(text: str) -> list[str]:
    """The pieces `count_tokens` counts, in order; joined they give `text` back."""
    return _TOKEN_RE.findall(text)


def filler_text(n_tokens: int, rng: random.Random) -> str:
    """A deterministic (for a seeded `rng`) text of exactly `n_tokens` tokens, each ' word'."""
    words = rng.choices(FILLER_WORDS, k=n_tokens)
    return "".join(" " + w for w in words)


def filler_token(index: int, seed: int) -> str:
    """The `index`-th token of the filler sequence for `seed`, without building the rest.

    Used to stream output one token at a time: the same (seed, index) always gives the same word.
    """
    h = (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    h ^= h >> 31
    return " " + FILLER_WORDS[h % len(FILLER_WORDS)]


def token_ids(pieces: Sequence[str] | Sequence[int]) -> list[int]:
    """Ids for `pieces` (< 2^31): a hash of each piece, or the ids themselves when they are
    ids. What the sim worker's KV events carry, so that a gateway tokenizing a prompt by the
    same rule finds the blocks an engine holds."""
    return [p if isinstance(p, int) else xxh32_intdigest(p.encode()) & 0x7FFFFFFF for p in pieces]
