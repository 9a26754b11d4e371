"""`fleetgate worker embed` as a process on a free port, with the real model, through the
official openai SDK and raw HTTP."""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import openai
import pytest

from tests.e2e.procs import fleetgate, get, metric, wait_ready

MODEL = "minilm-test"
TEXTS = ["a cat sits on the mat", "a kitten is on the rug", "stock prices fell"]
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 4)  # 38 tokens


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    args = ["worker", "embed", "--port", "0", "--model-name", MODEL, "--max-queue-items", "100"]
    with fleetgate(args) as proc:
        port = proc.wait_for(r"on http://127\.0\.0\.1:(\d+)")[0]
        base = f"http://127.0.0.1:{port}"
        wait_ready(base + "/health")
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[openai.OpenAI]:
    sdk = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    yield sdk
    sdk.close()


def post(
    url: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], dict[str, object]]:
    request = urllib.request.Request(
        url + "/v1/embeddings", json.dumps(body).encode(),
        {"content-type": "application/json", **(headers or {})}, method="POST",
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            headers = {k.lower(): v for k, v in response.headers.items()}
            return response.status, headers, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        headers = {k.lower(): v for k, v in exc.headers.items()}
        return exc.code, headers, json.loads(exc.read())


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("encoding", ["float", None])
def test_the_sdk_gets_unit_vectors_that_place_meanings(
    client: openai.OpenAI, encoding: Literal["float"] | None
) -> None:
    # Without encoding_format the SDK asks for base64 and decodes it itself.
    if encoding is None:
        answer = client.embeddings.create(model=MODEL, input=TEXTS)
    else:
        answer = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format=encoding)
    cat, kitten, stocks = (d.embedding for d in answer.data)
    assert [d.index for d in answer.data] == [0, 1, 2]
    for vec in (cat, kitten, stocks):
        assert len(vec) == 384 and math.isclose(dot(vec, vec), 1.0, rel_tol=1e-4)
    assert dot(cat, kitten) > dot(cat, stocks) + 0.3
    assert answer.model == MODEL
    # [CLS] and [SEP] around 6, 6 and 3 word pieces: the tokenizer's own counts.
    assert (answer.usage.prompt_tokens, answer.usage.total_tokens) == (21, 21)


def test_fewer_dimensions_are_the_first_ones_normalised_again(client: openai.OpenAI) -> None:
    full = client.embeddings.create(model=MODEL, input="a cat", encoding_format="float")
    short = client.embeddings.create(model=MODEL, input="a cat", dimensions=64)
    head = full.data[0].embedding[:64]
    norm = math.sqrt(dot(head, head))
    assert len(short.data[0].embedding) == 64
    assert all(
        math.isclose(s, h / norm, abs_tol=1e-6)
        for s, h in zip(short.data[0].embedding, head, strict=True)
    )


def test_models_and_health(url: str) -> None:
    status, _, body = get(url + "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == MODEL
    assert get(url + "/health")[0] == 200


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"input": [[101, 2003, 102]]}, 400, "token arrays are not supported"),
        ({"input": [17, 4]}, 400, "token arrays are not supported"),
        ({"input": []}, 400, "non-empty list"),
        ({"input": ["fine", ""]}, 400, "Input 1 is an empty string"),
        ({"input": "x " * 300}, 400, "this model takes at most 256"),
        ({"input": "x", "dimensions": 385}, 400, "dimensions must be between 1 and 384"),
        ({"input": "x", "model": "gpt-4"}, 404, "does not exist"),
        ({"input": "x", "priority": "urgent"}, 400, "critical, standard, sheddable"),
    ],
)
def test_what_it_cannot_embed_is_an_openai_error_that_says_why(
    url: str, body: dict[str, object], status: int, words: str
) -> None:
    got, _, answer = post(url, body)
    error = answer["error"]
    assert got == status and isinstance(error, dict) and words in error["message"]


def _when(condition: object, timeout_s: float = 10.0) -> None:
    """Poll the worker's own state (its /metrics) until `condition()` holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the worker never reached the state waited for"
        time.sleep(0.01)


def test_a_busy_queue_refuses_past_its_bound_and_times_requests_out(url: str) -> None:
    with ThreadPoolExecutor(1) as pool:
        big = pool.submit(post, url, {"input": [LONG] * 100})  # 4 batches, about a second
        _when(lambda: metric(url, "fleetgate_embed:num_inputs_waiting") > 0)
        # 100 more inputs cannot fit while any of the queue's 100 places is taken.
        status, headers, answer = post(url, {"input": ["more"] * 100})
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert answer["error"]["code"] == "queue_full"  # type: ignore[index]
        # One input behind the rest of `big`, which it may wait for only 50 ms.
        status, headers, answer = post(url, {"input": "late"},
                                       {"x-fleetgate-queue-timeout-s": "0.05"})  # fmt: skip
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert answer["error"]["code"] == "queue_timeout"  # type: ignore[index]
        assert "its limit of 50 ms" in answer["error"]["message"]  # type: ignore[index]
        assert big.result()[0] == 200
    assert metric(url, "fleetgate_embed:requests_total", outcome="queue_timeout") == 1
    assert metric(url, "fleetgate_embed:requests_total", outcome="queue_full") == 1
    assert metric(url, "fleetgate_embed:batch_size_count") > 0
