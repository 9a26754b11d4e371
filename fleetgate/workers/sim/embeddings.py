"""The sim worker's embeddings: deterministic unit vectors from a hash of each input, with no
engine time. The request and answer are the built-in workers' shared ones (workers/embeddings.py).
"""

from __future__ import annotations

import hashlib
import math
import struct

from fleetgate.tokens import count_tokens
from fleetgate.workers.embeddings import (
    InvalidEmbeddingsRequest,
    embeddings_answer,
    parse_embeddings,
)
from fleetgate.workers.sim.request import GenerationError, RequestParser

EMBEDDING_DIM = 384


class Embedder:
    def __init__(self, parser: RequestParser) -> None:
        self._parser = parser

    def embed(self, raw: bytes) -> bytes:
        """The answer to an embeddings request's body; GenerationError for a bad one."""
        try:
            body, dims = parse_embeddings(raw, EMBEDDING_DIM)
        except InvalidEmbeddingsRequest as exc:
            raise GenerationError(400, exc.message, exc.param) from None
        self._parser.check_model(body.model)
        inputs = [body.input] if isinstance(body.input, str) else body.input
        texts = [str(item) for item in inputs]
        tokens = sum(count_tokens(text) for text in texts)
        vectors = [_unit_vector(text) for text in texts]
        return embeddings_answer(vectors, dims, body.encoding_format, self._parser.model, tokens)


def _unit_vector(text: str) -> list[float]:
    """The text's full vector, of length 1."""
    digest = hashlib.sha256(text.encode()).digest() * (EMBEDDING_DIM * 4 // 32)
    raw = struct.unpack(f"<{EMBEDDING_DIM}i", digest[: EMBEDDING_DIM * 4])
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]
