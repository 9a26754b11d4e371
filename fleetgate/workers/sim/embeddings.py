"""The sim worker's embeddings: deterministic unit vectors from a hash of each input, with no
engine time.

`dimensions` truncates each vector to its first d components and normalises it again (what
OpenAI's text-embedding-3 models do); `encoding_format: "base64"` sends each vector as its
little-endian float32 bytes in base64, as OpenAI does.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from typing import Any, Literal

import msgspec

from fleetgate.tokens import count_tokens
from fleetgate.workers.sim.request import GenerationError, RequestParser

EMBEDDING_DIM = 384


class _EmbedBody(msgspec.Struct):
    input: str | list[Any]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


class Embedder:
    def __init__(self, parser: RequestParser) -> None:
        self._parser = parser
        self._decode = msgspec.json.Decoder(_EmbedBody)

    def embed(self, raw: bytes) -> bytes:
        """The answer to an embeddings request's body; GenerationError for a bad one."""
        try:
            body = self._decode.decode(raw)
        except msgspec.DecodeError as exc:
            raise GenerationError(400, f"invalid request body: {exc}") from None
        self._parser.check_model(body.model)
        dims = EMBEDDING_DIM if body.dimensions is None else body.dimensions
        if not 1 <= dims <= EMBEDDING_DIM:
            message = f"dimensions must be between 1 and {EMBEDDING_DIM} for this model"
            raise GenerationError(400, message, "dimensions")
        inputs = [body.input] if isinstance(body.input, str) else body.input
        data, tokens = [], 0
        for i, item in enumerate(inputs):
            text = str(item)
            tokens += count_tokens(text)
            vec = _unit_vector(text, dims)
            embedding: list[float] | str = vec
            if body.encoding_format == "base64":
                embedding = base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": embedding})
        return msgspec.json.encode(
            {"object": "list", "data": data, "model": self._parser.model,
             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        )  # fmt: skip


def _unit_vector(text: str, dims: int) -> list[float]:
    """The first `dims` components of the text's full vector, normalised to length 1."""
    digest = hashlib.sha256(text.encode()).digest() * (EMBEDDING_DIM * 4 // 32)
    raw = struct.unpack(f"<{dims}i", digest[: dims * 4])
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]
