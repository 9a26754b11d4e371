"""OpenAI's embeddings request and answer, as both built-in workers (sim and embed) speak them.

`dimensions` keeps each vector's first d components and normalises them again (what OpenAI's
text-embedding-3 models do); `encoding_format: "base64"` sends each vector as its
little-endian float32 bytes in base64, as OpenAI does (the official SDK asks for it by default
and decodes it itself).
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Sequence
from typing import Any, Literal

import msgspec


class EmbeddingsBody(msgspec.Struct):
    """The fields of an embeddings request the workers read; others are ignored."""

    input: str | list[Any]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    priority: int | str | None = None  # the embed worker's: a class name or a number


class InvalidEmbeddingsRequest(Exception):
    """A 400: what is wrong, and which field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


_decode = msgspec.json.Decoder(EmbeddingsBody).decode


def parse_embeddings(raw: bytes, native_dims: int) -> tuple[EmbeddingsBody, int]:
    """The request and the number of dimensions to answer with; InvalidEmbeddingsRequest for a
    body that is not one, or dimensions the model cannot give."""
    try:
        body = _decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidEmbeddingsRequest(f"invalid request body: {exc}") from None
    dims = native_dims if body.dimensions is None else body.dimensions
    if not 1 <= dims <= native_dims:
        message = f"dimensions must be between 1 and {native_dims} for this model"
        raise InvalidEmbeddingsRequest(message, "dimensions")
    return body, dims


def embeddings_answer(
    vectors: Sequence[Sequence[float]],
    dims: int,
    encoding: Literal["float", "base64"],
    model: str,
    prompt_tokens: int,
) -> bytes:
    """The answer's JSON bytes: one entry per vector (unit length, each `dims` long or more:
    longer ones are cut to `dims` and normalised again), in input order."""
    data = []
    for i, full in enumerate(vectors):
        vec = full if len(full) == dims else _shortened(full, dims)
        embedding: Sequence[float] | str = vec
        if encoding == "base64":
            embedding = base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    return msgspec.json.encode(
        {"object": "list", "data": data, "model": model,
         "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
    )  # fmt: skip


def _shortened(vec: Sequence[float], dims: int) -> list[float]:
    """The first `dims` components, normalised to length 1."""
    head = vec[:dims]
    norm = math.sqrt(sum(v * v for v in head)) or 1.0
    return [v / norm for v in head]
