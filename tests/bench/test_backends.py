"""Load per backend from a gateway's /metrics: parsing fixed pages, differencing counters into
per-second rates, and the sampler against real servers on real sockets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from bench_fake_openai import FakeOpenAI

from fleetgate.bench.backends import (
    BackendSampler,
    BackendSeries,
    NotAGateway,
    ScrapeSeries,
    increase,
    parse_scrape,
)
from fleetgate.http.client import HttpClient, Origin

# A gateway's page, cut down: two pools share backend a; other series are ignored.
PAGE = """\
# HELP fleetgate_requests_total Requests answered, by model, backend and HTTP status.
# TYPE fleetgate_requests_total counter
fleetgate_requests_total{backend="a",model="m",status="200"} 10.0
fleetgate_requests_total{backend="a",model="m",status="503"} 2.0
fleetgate_requests_total{backend="a",model="n",status="200"} 5.0
fleetgate_requests_total{backend="none",model="m",status="429"} 7.0
fleetgate_requests_total_created{backend="a",model="m",status="200"} 1.7e9
# TYPE fleetgate_backend_in_flight_requests gauge
fleetgate_backend_in_flight_requests{backend="a",model="m"} 3.0
fleetgate_backend_in_flight_requests{backend="a",model="n"} 1.0
fleetgate_backend_in_flight_requests{backend="b",model="m"} 0.0
# TYPE fleetgate_backend_healthy gauge
fleetgate_backend_healthy{backend="a",model="m"} 1.0
fleetgate_backend_healthy{backend="a",model="n"} 0.0
fleetgate_backend_healthy{backend="b",model="m"} 1.0
# TYPE fleetgate_backend_in_flight_tokens gauge
fleetgate_backend_in_flight_tokens{backend="a",model="m"} 900.0
# TYPE fleetgate_request_seconds histogram
fleetgate_request_seconds_bucket{model="m",le="+Inf"} 17.0
"""


def page(answers: dict[tuple[str, str], float], in_flight: dict[str, float]) -> str:
    """A page of pool m: answers by (backend, status), in flight by backend, all healthy."""
    lines = [
        f'fleetgate_requests_total{{backend="{b}",model="m",status="{s}"}} {v}'
        for (b, s), v in answers.items()
    ]
    for b, v in in_flight.items():
        lines.append(f'fleetgate_backend_in_flight_requests{{backend="{b}",model="m"}} {v}')
        lines.append(f'fleetgate_backend_healthy{{backend="{b}",model="m"}} 1')
    return "\n".join(lines) + "\n"


def test_a_page_is_read_per_backend_summed_over_its_pools() -> None:
    scrape = parse_scrape(PAGE)
    assert scrape.backends == ["a", "b"]  # "none" (refused before routing) is no backend
    assert scrape.in_flight == {"a": 4.0, "b": 0.0}
    assert scrape.healthy == {"a": False, "b": True}  # flagged in one of its pools
    assert scrape.answered == {
        ("a", "m", "200"): 10.0,
        ("a", "m", "503"): 2.0,
        ("a", "n", "200"): 5.0,
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('vllm:num_requests_running{model_name="x"} 1.0\n', "has no"),  # a plain vLLM server
        ("<!DOCTYPE html>\n<html><body>Not Found</body></html>\n", "has no"),
        ('{"error": {"message": "no /metrics"}}', "has no"),
        ('fleetgate_backend_healthy{backend="a" 1\n', "not Prometheus text"),
        ("", "has no"),
    ],
)
def test_a_page_without_the_series_is_no_gateway(text: str, says: str) -> None:
    with pytest.raises(NotAGateway, match=says):
        parse_scrape(text)


def test_counters_are_differenced_into_rates_per_backend() -> None:
    series = ScrapeSeries()
    series.add(0.0, parse_scrape(page({("a", "200"): 10}, {"a": 2})))
    series.add(1.0, parse_scrape(page({("a", "200"): 15, ("a", "500"): 1}, {"a": 4})))
    series.add(3.0, parse_scrape(page({("a", "200"): 25, ("a", "500"): 3}, {"a": 1})))
    a = series.backends["a"]
    assert a.at_s == [0.0, 1.0, 3.0]
    assert a.in_flight == [2.0, 4.0, 1.0]
    assert a.healthy == [True, True, True]
    # Nothing to difference the first against; the 500 series counted from 0 when it appeared;
    # the last increase is spread over the two seconds since the scrape before.
    assert a.answers_per_s == [None, 6.0, 6.0]
    assert a.errors_per_s == [None, 1.0, 1.0]


def test_a_counter_reset_counts_from_zero() -> None:
    assert increase(10.0, 14.0) == 4.0
    assert increase(10.0, 3.0) == 3.0  # restarted, then counted 3
    series = ScrapeSeries()
    series.add(0.0, parse_scrape(page({("a", "200"): 100, ("a", "502"): 9}, {"a": 0})))
    series.add(1.0, parse_scrape(page({("a", "200"): 4}, {"a": 0})))  # the gateway restarted
    series.add(2.0, parse_scrape(page({("a", "200"): 6, ("a", "502"): 1}, {"a": 0})))
    a = series.backends["a"]
    assert a.answers_per_s == [None, 4.0, 3.0]
    assert a.errors_per_s == [None, 0.0, 1.0]


def test_a_backend_appearing_mid_run_starts_its_series_there() -> None:
    series = ScrapeSeries()
    series.add(0.0, parse_scrape(page({("a", "200"): 1}, {"a": 1})))
    series.add(1.0, parse_scrape(page({("a", "200"): 2}, {"a": 1, "b": 0})))  # b: no answer yet
    series.add(2.0, parse_scrape(page({("a", "200"): 3, ("b", "200"): 4}, {"a": 1, "b": 2})))
    b = series.backends["b"]
    assert b.at_s == [1.0, 2.0]
    assert b.in_flight == [0.0, 2.0]
    assert b.answers_per_s == [0.0, 4.0]  # its counter appeared at 4: all of it since 1.0
    assert series.backends["a"].answers_per_s == [None, 1.0, 1.0]


def test_unhealthy_spans_run_from_the_sample_that_said_so_to_the_next_that_did_not() -> None:
    series = BackendSeries(
        at_s=[0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        healthy=[True, False, False, True, None, False],
    )
    assert series.unhealthy_spans(end_s=5.5) == [(1.0, 3.0), (5.0, 5.5)]


async def test_a_server_without_metrics_is_asked_once(fake_openai: FakeOpenAI) -> None:
    http = HttpClient()
    try:
        sampler = BackendSampler(http, Origin.parse(fake_openai.url), clock=time.perf_counter)
        await sampler.run()  # returns by itself: the first answer was a 404
    finally:
        await http.close()
    assert fake_openai.not_found == ["/metrics"]
    load = sampler.load()
    assert load.backends == {}
    assert load.unavailable == "GET /metrics answered 404"


@pytest.fixture
async def silent_metrics() -> AsyncIterator[tuple[str, list[int]]]:
    """A server that reads each request and never answers: its URL, and the requests it got."""
    got: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            got.append(1)
            await reader.read()  # until the client gives up
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", got
    server.close()


async def test_a_silent_target_gets_one_scrape_at_a_time_each_cut_off(
    silent_metrics: tuple[str, list[int]],
) -> None:
    url, got = silent_metrics
    waits: list[float] = []
    enough = asyncio.Event()

    async def sleep(delay_s: float) -> None:  # the sampler's pause between scrapes, counted
        waits.append(delay_s)
        if len(waits) == 3:
            enough.set()
        await asyncio.sleep(0)

    http = HttpClient()
    origin = Origin.parse(url)
    clock = time.perf_counter
    sampler = BackendSampler(
        http, origin, clock=clock, sleep=sleep, interval_s=0.01, timeout_s=0.05
    )
    started = time.perf_counter()
    try:
        async with sampler.running():
            await asyncio.wait_for(enough.wait(), timeout=10)
    finally:
        await http.close()
    # Each scrape waited out its timeout before the next began: none overlapped, and the
    # pauses were cut to nothing (each scrape took longer than the interval).
    assert len(got) in (3, 4)  # the fourth may have been sent before the block ended
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert time.perf_counter() - started >= 0.15
    load = sampler.load()
    assert load.backends == {}
    assert load.unavailable is not None
    assert load.unavailable.startswith("its /metrics never answered")
