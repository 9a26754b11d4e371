"""The ids of files and batches: drawn at random, and checked before any path is built from
one (a client's string never names a path of its own choosing)."""

from __future__ import annotations

import random
import string

_ID_CHARS = frozenset(string.ascii_letters + string.digits + "_-")
_ALPHABET = string.ascii_letters + string.digits
_RANDOM_CHARS = 24  # 62**24: about 143 bits


def draw_id(rng: random.Random, prefix: str) -> str:
    """`prefix` and 24 random letters and digits."""
    return prefix + "".join(rng.choices(_ALPHABET, k=_RANDOM_CHARS))


def valid_id(text: str) -> bool:
    """Whether `text` may name a file or batch: 1 to 64 of [A-Za-z0-9_-]."""
    return 0 < len(text) <= 64 and _ID_CHARS.issuperset(text)
