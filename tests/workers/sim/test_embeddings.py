"""The sim worker's embeddings through the official SDK: floats, base64, fewer dimensions."""

from __future__ import annotations

import base64
import json
import math
import struct

import openai

from tests.workers.sim.conftest import Worker


async def test_base64_and_dimensions_as_openai_sends_them(
    sdk: openai.AsyncOpenAI, worker: Worker
) -> None:
    floats = await sdk.embeddings.create(model="m", input="a cat", encoding_format="float")
    full = floats.data[0].embedding
    assert len(full) == 384 and math.isclose(sum(v * v for v in full), 1.0)
    # The SDK decodes base64 itself: ask over raw HTTP to see the bytes.
    status, raw = await worker.call(b"POST", b"/v1/embeddings", {"model": "m", "input": "a cat",
                                    "encoding_format": "base64", "dimensions": 8})  # fmt: skip
    encoded = json.loads(raw)["data"][0]["embedding"]
    short = struct.unpack("<8f", base64.b64decode(encoded))
    norm = math.sqrt(sum(v * v for v in full[:8]))
    assert status == 200 and all(
        math.isclose(s, v / norm, rel_tol=1e-6) for s, v in zip(short, full[:8], strict=True)
    )
    via_sdk = await sdk.embeddings.create(model="m", input="a cat", dimensions=8)
    assert [round(v, 6) for v in via_sdk.data[0].embedding] == [round(v, 6) for v in short]


async def test_dimensions_beyond_the_model_are_refused(worker: Worker) -> None:
    for dimensions in (0, 385):
        body = {"model": "m", "input": "x", "dimensions": dimensions}
        status, raw = await worker.call(b"POST", b"/v1/embeddings", body)
        assert status == 400 and json.loads(raw)["error"]["param"] == "dimensions"
