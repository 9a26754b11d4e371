"""What the simulated engine needs to know about a prompt: its length and its block hashes.

Tokens are counted by the project's one rule (fleetgate.tokens.split_tokens). Each full block
of `block_size` tokens is hashed chained on the block before it, as vLLM does:
    h_0 = hash((ROOT, tokens[0:bs])),  h_i = hash((h_{i-1}, tokens[i*bs:(i+1)*bs]))
so equal hashes at block i mean equal prompts up to the end of block i. Texts that share a
prefix share the leading block hashes (all blocks that end before the last token the prefix
has in common). Hashes use Python's `hash`, which is salted per process: stable for the life
of one engine, which is all the prefix cache needs.

Cost, measured on the development machine (CPython 3.11): `from_text` on a 5,000-token prompt
takes ~0.6 ms, ~0.5 ms of it the tokenizer regex and ~0.1 ms hashing 312 blocks;
`from_token_ids` on 5,000 ids ~0.09 ms.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from fleetgate.tokens import split_tokens

_ROOT_HASH = 0x5EED_B10C  # parent of the first block; any constant works


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """A prompt as the engine sees it."""

    num_tokens: int
    """Prompt length in tokens."""
    block_size: int
    """Tokens per block the hashes were made for; must match the engine's."""
    block_hashes: tuple[int, ...]
    """Chained hash of each full block, first block first (num_tokens // block_size of them)."""
    pieces: Sequence[str] | Sequence[int] = ()
    """The tokens (the token rule's pieces, or the ids given), for KV events; () if unknown."""

    def __post_init__(self) -> None:
        if self.num_tokens < 1:
            raise ValueError("a prompt has at least one token")
        if len(self.block_hashes) != self.num_tokens // self.block_size:
            raise ValueError("need one hash per full block")


def from_text(text: str, block_size: int = 16) -> PromptBlocks:
    """The prompt `text`, tokenized and block-hashed; an empty text counts as one token."""
    tokens = split_tokens(text)
    n = len(tokens)
    hashes: list[int] = []
    h = _ROOT_HASH
    for start in range(0, n - block_size + 1, block_size):
        h = hash((h, tuple(tokens[start : start + block_size])))
        hashes.append(h)
    # An empty prompt still occupies one position (vLLM would hold the BOS token).
    return PromptBlocks(max(n, 1), block_size, tuple(hashes), tokens)


def from_token_ids(token_ids: Sequence[int], block_size: int = 16) -> PromptBlocks:
    """A prompt given as token ids (OpenAI completions accept these); hashed like `from_text`."""
    n = len(token_ids)
    hashes: list[int] = []
    h = _ROOT_HASH
    for start in range(0, n - block_size + 1, block_size):
        h = hash((h, tuple(token_ids[start : start + block_size])))
        hashes.append(h)
    return PromptBlocks(max(n, 1), block_size, tuple(hashes), token_ids)


def synthetic(num_tokens: int, block_size: int, key: Hashable) -> PromptBlocks:
    """A prompt of `num_tokens` tokens whose blocks share nothing with any other `key`'s.

    For load generators that need distinct prompts without building text. `key` is hashed
    once, so a large key costs nothing per block.
    """
    salt = hash(("synthetic", key))
    hashes: list[int] = []
    h = salt
    for _ in range(num_tokens // block_size):
        h = hash((h, salt))
        hashes.append(h)
    return PromptBlocks(num_tokens, block_size, tuple(hashes))
