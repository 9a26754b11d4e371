"""The rest of the OpenAI surface through a real gateway: the Responses API against real sim
workers (with the openai SDK), a model's card, and pass-through paths (rerank, a multipart
audio upload) relayed to a backend that serves them, routed by their `model`."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import openai
import pytest

from tests.e2e.procs import gateway, metric, sim_workers

MODEL = "sim-8b"
OTHER = "reranker"


class _Echo(BaseHTTPRequestHandler):
    """A backend serving other model paths: it answers with what it was sent."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.seen.append(
            {"path": self.path, "type": self.headers["content-type"], "body": body,
             "auth": self.headers.get("authorization")}
        )  # fmt: skip
        answer = json.dumps({"text": "heard", "path": self.path, "bytes": len(body)}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, echo: str) -> Iterator[str]:
    quiet = {"health_check": {"enabled": False}, "engine_metrics": {"enabled": False}}
    with sim_workers(MODEL, 2) as workers:
        config = {
            "pools": [
                # Prices make the gateway count every answer's tokens (fleetgate_tokens_total).
                {"model": MODEL, "backends": [{"url": u} for u in workers],
                 "pricing": {"input_per_1m_usd": 1.0, "output_per_1m_usd": 2.0}},
                {"model": OTHER, "backends": [{"url": echo}], **quiet},
            ],
        }  # fmt: skip
        path = tmp_path_factory.mktemp("surface") / "gw.yaml"
        path.write_text(json.dumps(config))
        with gateway(["--config", str(path)]) as (base, _):
            yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def _completion_tokens(url: str) -> float:
    return metric(url, "fleetgate_tokens_total", model=MODEL, kind="completion")


def test_a_response_is_answered_and_its_usage_counted(client: openai.OpenAI, url: str) -> None:
    before = _completion_tokens(url)
    response = client.responses.create(
        model=MODEL, input="Tell me about the sea.", instructions="Be brief.",
        max_output_tokens=9,
    )  # fmt: skip
    assert response.output_text
    assert response.usage is not None and 0 < response.usage.output_tokens <= 9
    assert _completion_tokens(url) - before == response.usage.output_tokens


def test_a_streamed_response_relays_its_typed_events_and_counts_usage(
    client: openai.OpenAI, url: str
) -> None:
    before = _completion_tokens(url)
    kinds, deltas = [], []
    with client.responses.stream(model=MODEL, input="Count to five.", max_output_tokens=6) as s:
        for event in s:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = s.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "".join(deltas) == final.output_text
    assert final.usage is not None
    assert _completion_tokens(url) - before == final.usage.output_tokens


def test_a_model_card_is_served_and_an_unknown_one_is_a_404(client: openai.OpenAI) -> None:
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-9")
    assert info.value.code == "model_not_found"


def test_a_passthrough_path_goes_to_the_model_s_pool_as_it_came(
    client: openai.OpenAI, url: str
) -> None:
    _Echo.seen.clear()
    body = {"model": OTHER, "query": "sea", "documents": ["a", "b"]}
    answer = client.post("/rerank", body=body, cast_to=object)
    assert isinstance(answer, dict) and answer["path"] == "/v1/rerank"
    sent = _Echo.seen[-1]
    assert json.loads(sent["body"]) == body and sent["type"] == "application/json"
    assert sent["auth"] is None  # the client's key never reaches a backend


def test_a_multipart_upload_is_routed_by_its_model_field(
    client: openai.OpenAI, tmp_path: Path
) -> None:
    _Echo.seen.clear()
    audio = tmp_path / "clip.wav"
    audio.write_bytes(b"RIFF" + bytes(range(256)) * 40)
    text = client.audio.transcriptions.create(model=OTHER, file=audio.open("rb"))
    assert text.text == "heard"
    sent = _Echo.seen[-1]
    assert sent["path"] == "/v1/audio/transcriptions"
    assert sent["type"].startswith("multipart/form-data; boundary=")
    assert bytes(range(256)) * 40 in sent["body"]  # the file went as it came


def test_a_form_without_a_model_or_a_path_not_allowed_is_refused(
    client: openai.OpenAI, tmp_path: Path
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.post(
            "/audio/transcriptions", cast_to=object, body={"language": "en"},
            files=[("file", ("a.wav", b"RIFF"))],
            options={"headers": {"content-type": "multipart/form-data"}},
        )  # fmt: skip
    assert info.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        client.post("/fine_tuning/jobs", body={"model": OTHER}, cast_to=object)


def test_a_follow_up_reaches_the_worker_that_keeps_its_response(client: openai.OpenAI) -> None:
    """Each sim worker keeps the responses it made, as vLLM does, and answers 404 for any
    other: the follow-ups go where their response is kept, whole or streamed."""
    first = client.responses.create(model=MODEL, input="Hi.", max_output_tokens=3)
    with client.responses.stream(model=MODEL, input="Hi.", max_output_tokens=3) as s:
        streamed = s.get_final_response()
    for made in (first, streamed):
        for _ in range(6):  # the pool has two workers: unpinned, about half would 404
            later = client.responses.create(
                model=MODEL, input="And then?", max_output_tokens=2, previous_response_id=made.id
            )
            assert later.output_text
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_nowhere")
