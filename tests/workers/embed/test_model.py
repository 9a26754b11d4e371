"""MiniLM as the worker loads it: the packaged ONNX model and the shipped tokenizer."""

from __future__ import annotations

import math

import pytest

from fleetgate.workers.embed.model import NATIVE_DIMS, MiniLM

TEXTS = ["a cat sits on the mat", "a kitten is on the rug", "stock prices fell"]


@pytest.fixture(scope="module")
def minilm() -> MiniLM:
    return MiniLM()


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_tokens_are_wordpieces_with_cls_and_sep(minilm: MiniLM) -> None:
    ids = minilm.tokenize(["Hello, world!", "embeddings"])
    assert ids[0] == [101, 7592, 1010, 2088, 999, 102]  # [CLS] hello , world ! [SEP]
    assert ids[1][0] == 101 and ids[1][-1] == 102 and len(ids[1]) > 3  # split in word pieces


def test_embeddings_are_unit_vectors_whose_similarity_means_something(minilm: MiniLM) -> None:
    cat, kitten, stocks = minilm.run(minilm.tokenize(TEXTS))
    for vec in (cat, kitten, stocks):
        assert len(vec) == NATIVE_DIMS
        assert math.isclose(math.sqrt(sum(v * v for v in vec)), 1.0, rel_tol=1e-5)
    assert cosine(cat, kitten) > 0.5 > 0.2 > cosine(cat, stocks)


def test_padding_in_a_batch_leaves_an_embedding_unchanged(minilm: MiniLM) -> None:
    short, long = minilm.tokenize(["a cat", "a much longer sentence about many other things"])
    alone = minilm.run([short])[0]
    padded = minilm.run([short, long])[0]
    assert cosine(alone, padded) > 0.9999
