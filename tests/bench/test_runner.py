"""The open-loop driver against a real server on a socket."""

from __future__ import annotations

import asyncio
import io
import socket
import time
from collections.abc import AsyncIterator

import pytest
from bench_fake_openai import FakeOpenAI
from rich.console import Console

from fleetgate.bench.progress import ProgressBar
from fleetgate.bench.runner import LoadGenerator, LoadSettings
from fleetgate.bench.workloads import RequestSpec, user_request
from fleetgate.http.client import HttpClient, Origin


class FakeClock:
    """Virtual time: sleeping moves it forward at once, so schedules are checked exactly."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)  # let other tasks run, as a real sleep would


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    http = HttpClient()
    yield http
    await http.close()


def specs(n: int, max_tokens: int = 5, at: float = 0.0) -> list[RequestSpec]:
    return [user_request(at * i, " the of and", 3, max_tokens, "chat") for i in range(n)]


async def test_streams_are_timed_and_their_tokens_counted(
    fake_openai: FakeOpenAI, client: HttpClient
) -> None:
    bar = ProgressBar(10.0, Console(file=io.StringIO()))
    work = [*specs(3), user_request(0.0, " a b", 2, 4, "completions")]
    settings = LoadSettings(model="m", duration_s=10.0, api_key="k")
    generator = LoadGenerator(
        client, Origin.parse(fake_openai.url), settings, clock=time.perf_counter, observer=bar
    )
    with bar:
        result = await generator.run(work)
    assert sorted(r.index for r in result.records) == [0, 1, 2, 3]
    for record in result.records:
        assert record.error is None
        assert record.output_tokens == work[record.index].max_tokens  # from usage
        assert record.ttft_s is not None
        assert 0 < record.ttft_s <= (record.e2e_s or 0)
        assert len(record.itl_s) <= record.output_tokens - 1
    assert (bar.sent, bar.done, bar.errors) == (4, 4, 0)
    sent = fake_openai.requests[0]
    assert sent["model"] == "m"
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["ignore_eos"] is True
    assert sorted("prompt" in r for r in fake_openai.requests) == [False, False, False, True]


async def test_sends_on_schedule_without_waiting_for_responses(
    fake_openai: FakeOpenAI, client: HttpClient
) -> None:
    fake_openai.mode = "hang"  # no response ever comes
    clock = FakeClock()
    settings = LoadSettings(model="m", duration_s=2.0, grace_s=0.0)
    generator = LoadGenerator(
        client, Origin.parse(fake_openai.url), settings, clock=clock, sleep=clock.sleep
    )
    result = await generator.run(specs(6, at=0.5))  # at 0, 0.5, ... 2.5: the last two too late
    assert sorted(r.sent_s for r in result.records) == [0.0, 0.5, 1.0, 1.5]
    assert all(r.sent_s == r.scheduled_s for r in result.records)
    assert {r.error for r in result.records} == {"timeout"}
    assert result.max_lag_s == 0.0


async def test_failures_are_recorded_by_kind(fake_openai: FakeOpenAI, client: HttpClient) -> None:
    settings = LoadSettings(model="m", duration_s=10.0)

    async def kinds(url: str) -> set[str | None]:
        generator = LoadGenerator(client, Origin.parse(url), settings, clock=time.perf_counter)
        return {r.error for r in (await generator.run(specs(2))).records}

    fake_openai.mode = "status_503"
    assert await kinds(fake_openai.url) == {"http_503"}
    fake_openai.mode = "error_event"
    assert await kinds(fake_openai.url) == {"stream_error"}
    with socket.socket() as s:  # a port with nothing listening on it
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    assert await kinds(f"http://127.0.0.1:{free_port}") == {"connect"}


async def test_whole_responses_without_streaming(
    fake_openai: FakeOpenAI, client: HttpClient
) -> None:
    settings = LoadSettings(model="m", duration_s=10.0, stream=False)
    generator = LoadGenerator(
        client, Origin.parse(fake_openai.url), settings, clock=time.perf_counter
    )
    (record,) = (await generator.run(specs(1, max_tokens=7))).records
    assert (record.error, record.output_tokens, record.ttft_s) == (None, 7, None)
    assert fake_openai.requests[0]["stream"] is False


async def test_stop_ends_sending_and_still_finishes_the_requests_in_flight(
    fake_openai: FakeOpenAI, client: HttpClient
) -> None:
    clock = FakeClock()
    settings = LoadSettings(model="m", duration_s=1000.0)
    generator = LoadGenerator(
        client, Origin.parse(fake_openai.url), settings, clock=clock, sleep=clock.sleep
    )
    stop = asyncio.Event()
    stop.set()
    result = await generator.run(specs(100, at=0.1), stop)
    assert 0 < len(result.records) < 100
    assert {r.error for r in result.records} == {None}


async def test_cancelling_a_run_propagates(fake_openai: FakeOpenAI, client: HttpClient) -> None:
    fake_openai.mode = "hang"
    settings = LoadSettings(model="m", duration_s=10.0)
    generator = LoadGenerator(
        client, Origin.parse(fake_openai.url), settings, clock=time.perf_counter
    )
    run = asyncio.create_task(generator.run(specs(2)))
    await fake_openai.got_request.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
