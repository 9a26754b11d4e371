"""Recognising what serves a backend, and what the gateway then does differently."""

from __future__ import annotations

import asyncio
import random

import pytest

from fleetgate.clock import LoopClock
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.engines import ENGINES, PENDING, by_metrics, by_models
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.fleet.scraper import MetricsScraper, ScrapeSettings
from fleetgate.http.errors import ConnectError
from fleetgate.http.mock import MockTransport, Script, Sent

LLAMA_MODELS = b'{"object":"list","data":[{"id":"g","object":"model","owned_by":"llamacpp"}]}'
PLAIN_MODELS = b'{"object":"list","data":[{"id":"g","object":"model","owned_by":"acme"}]}'


@pytest.mark.parametrize(
    ("body", "server", "kind"),
    [
        (b'{"data":[{"id":"m","owned_by":"vllm"}]}', None, "vllm"),
        (b'{"data":[{"id":"m","owned_by":"sglang"}]}', b"uvicorn", "sglang"),
        (LLAMA_MODELS, None, "llamacpp"),
        (PLAIN_MODELS, b"llama.cpp", "llamacpp"),  # the Server header, when the owner is not
        (b'{"data":[{"id":"m","owned_by":"fleetgate"}]}', None, "fleetgate"),
        (PLAIN_MODELS, None, None),
        (b"not json", b"text-generation-inference", "tgi"),
    ],
)
def test_a_models_listing_names_its_engine(body: bytes, server: bytes | None, kind: str) -> None:
    assert by_models(body, server) == kind


def test_metrics_names_name_their_engine() -> None:
    assert by_metrics(b"# HELP x\nllamacpp:requests_processing 0\n") == "llamacpp"
    assert by_metrics(b"tgi_queue_size 3\n") == "tgi"
    assert by_metrics(b"vllm:num_requests_running 1\n") == "vllm"
    assert by_metrics(b"# a comment naming vllm:num_requests_running\nprocess_cpu 1\n") is None


def _scraper(answers: dict[bytes, Script]) -> tuple[MetricsScraper, list[bytes]]:
    asked: list[bytes] = []

    def answer(sent: Sent) -> Script:
        asked.append(sent.path)
        return answers.get(sent.path, Script(404))

    return MetricsScraper(MockTransport(answer), LoopClock(lambda: 0.0), random.Random(0)), asked


@pytest.mark.parametrize(
    ("answers", "kind"),
    [
        ({b"/v1/models": Script(200, [LLAMA_MODELS]),
          b"/metrics": Script(200, [b"llamacpp:requests_processing 2\n"])}, "llamacpp"),
        ({b"/v1/models": Script(200, [PLAIN_MODELS]),
          b"/metrics": Script(200, [b"tgi_queue_size 1\n"])}, "tgi"),
        ({b"/v1/models": Script(200, [PLAIN_MODELS]),
          b"/api/version": Script(200, [b'{"version":"0.9"}'])}, "ollama"),
        ({b"/v1/models": Script(200, [PLAIN_MODELS])}, "openai"),
    ],
)  # fmt: skip
async def test_an_auto_backend_is_recognised_on_its_first_scrape(
    answers: dict[bytes, Script], kind: str
) -> None:
    scraper, asked = _scraper(answers)
    state = BackendState(Backend("b", "http://127.0.0.1:9", ("m",)))
    assert state.kind is PENDING
    read = await scraper.scrape(state, ScrapeSettings(), MemoryLoadBoard())
    assert state.kind is ENGINES[kind]
    assert read == (kind in ("llamacpp", "tgi"))  # their load is read; the others have none
    if kind == "llamacpp":
        assert state.engine is not None and state.engine.running == 2
    asked.clear()
    await scraper.scrape(state, ScrapeSettings(), MemoryLoadBoard())  # known now: not probed again
    assert asked == ([b"/metrics"] if ENGINES[kind].metrics else [])


async def test_a_backend_that_does_not_answer_stays_pending_and_is_probed_again() -> None:
    asked: list[bytes] = []

    def down(sent: Sent) -> Script:
        asked.append(sent.path)
        return Script(error=ConnectError("refused"))

    scraper = MetricsScraper(MockTransport(down), LoopClock(lambda: 0.0), random.Random(0))
    state = BackendState(Backend("b", "http://127.0.0.1:9", ("m",)))
    assert not await scraper.scrape(state, ScrapeSettings(), MemoryLoadBoard())
    assert state.kind is PENDING and b"/v1/models" in asked
    asked.clear()
    await scraper.scrape(state, ScrapeSettings(), MemoryLoadBoard())
    assert b"/v1/models" in asked


def test_a_configured_engine_is_not_probed() -> None:
    state = BackendState(Backend("b", "http://127.0.0.1:9", ("m",), engine="ollama"))
    assert state.kind is ENGINES["ollama"] and state.kind.health_path == "/api/version"


async def test_with_scraping_off_an_auto_backend_is_still_recognised_then_left_alone() -> None:
    scraper, asked = _scraper({b"/v1/models": Script(200, [LLAMA_MODELS])})
    state = BackendState(Backend("b", "http://127.0.0.1:9", ("m",)))
    scraper.start([state], ScrapeSettings(enabled=False, interval_s=0.01), MemoryLoadBoard())
    for _ in range(100):
        if state.kind is not PENDING:
            break
        await asyncio.sleep(0.01)
    assert state.kind is ENGINES["llamacpp"]
    await asyncio.sleep(0.05)
    assert asked.count(b"/v1/models") == 1 and b"/metrics" not in asked  # then not again
    scraper.stop()
