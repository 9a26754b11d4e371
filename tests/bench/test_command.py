"""`fleetgate bench` from flags to summary.json, and the config the flags make; against a
real gateway over sim workers, its load per backend."""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
from pathlib import Path

import pytest
from bench_fake_openai import FakeOpenAI
from test_plots import assert_png

from fleetgate.bench.command import add_arguments, config_from_args, run
from fleetgate.bench.config import WORKLOADS, BenchConfig, build_workload
from fleetgate.bench.generated import LengthDist
from fleetgate.bench.report import write_results
from fleetgate.bench.stats import RequestRecord, Slo, summarize
from fleetgate.bench.workloads import Bursts, PoissonArrivals, TraceTimes
from fleetgate.config import parse_config
from fleetgate.running import start_gateway


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fleetgate bench")
    add_arguments(parser)
    return parser.parse_args(["--target", "http://127.0.0.1:1", *argv])


def test_flags_make_a_validated_config() -> None:
    config = config_from_args(parse("--workload", "mooncake-conv", "--trace-speed", "2"))
    assert config.arrivals == TraceTimes(2.0)
    assert config.effective_arrivals == TraceTimes(2.0)
    assert config_from_args(parse()).effective_arrivals == TraceTimes(1.0)
    synthetic = config_from_args(parse("--workload", "synthetic", "--output-len", "9"))
    assert synthetic.effective_arrivals == PoissonArrivals(10.0)
    assert synthetic.output_len == LengthDist(9)
    assert synthetic.shared_prefix.output_len == 9
    assert config_from_args(parse("--workload", "shared-prefix")).shared_prefix.output_len == 256
    with pytest.raises(ValueError, match="trace-speed"):
        config_from_args(parse("--workload", "synthetic", "--trace-speed", "2"))
    with pytest.raises(ValueError, match="duration"):
        config_from_args(parse("--duration", "0"))
    with pytest.raises(SystemExit):
        parse("--rate", "1", "--trace-speed", "2")  # one pace or the other


def test_code_completion_sends_long_prompts_and_short_answers_in_bursts() -> None:
    config = config_from_args(parse("--workload", "code-completion", "--rate", "30"))
    assert config.effective_arrivals == Bursts(30.0, 8.0, 1.0)
    assert config.to_json()["arrivals"] == {"kind": "bursts", "rate": 30.0, "size": 8.0,
                                            "spread_s": 1.0}  # fmt: skip
    specs = list(itertools.islice(build_workload(config, random.Random(0)), 2000))
    prompts, answers = [s.prompt_tokens for s in specs], [s.max_tokens for s in specs]
    assert min(prompts) >= 1000 and max(prompts) <= 3000
    assert min(answers) >= 15 and max(answers) <= 45
    assert statistics.fmean(prompts) == pytest.approx(2000, rel=0.03)
    assert statistics.fmean(answers) == pytest.approx(30, rel=0.03)
    # Its lengths and bursts follow the flags; a plain workload can be sent in bursts too.
    longer = config_from_args(parse("--workload", "code-completion", "--input-len", "4000"))
    assert longer.input_len == LengthDist(4000, "uniform", 0.5)
    assert longer.effective_arrivals == Bursts(10.0, 8.0, 1.0)
    plain = config_from_args(parse("--workload", "synthetic", "--burst-size", "4", "--rate", "5"))
    assert plain.effective_arrivals == Bursts(5.0, 4.0, 1.0)
    assert config_from_args(parse("--workload", "synthetic")).input_len is None  # its default
    wider = config_from_args(parse("--workload", "synthetic", "--burst-spread", "3"))
    assert wider.effective_arrivals == Bursts(10.0, 8.0, 3.0)
    with pytest.raises(ValueError, match="finite --rate"):
        config_from_args(parse("--workload", "code-completion", "--rate", "inf"))
    for flags, message in ((("--burst-size", "0.5"), "burst size"),
                           (("--burst-size", "1e9"), "burst size must be from 1 to 10,000"),
                           (("--burst-spread", "nan"), "burst spread"),
                           (("--rate", "0"), "request rate")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            config_from_args(parse("--workload", "code-completion", *flags))


def test_every_workload_builds_lazily_and_within_its_bounds() -> None:
    for name in WORKLOADS:
        config = BenchConfig(target="http://x", workload=name, arrivals=None, max_requests=3)
        specs = list(build_workload(config, random.Random(0)))
        assert len(specs) == 3, name
        assert [s.at_s for s in specs] == sorted(s.at_s for s in specs)
    # A rate keeps a trace's lengths but draws new times.
    config = BenchConfig(target="http://x", arrivals=PoissonArrivals(1000.0), max_requests=2)
    assert [s.prompt_tokens for s in build_workload(config, random.Random(0))] == [374, 396]
    short = BenchConfig(target="http://x", duration_s=5.0)  # azure-conv's first 5 s
    assert len(list(itertools.islice(build_workload(short, random.Random(0)), 100))) == 4


def test_config_json_names_the_arrivals_and_cites_the_trace() -> None:
    doc = BenchConfig(target="http://x", arrivals=PoissonArrivals(float("inf"))).to_json()
    assert doc["arrivals"] == {"kind": "poisson", "rate": "inf"}
    assert "CC-BY-4.0" in doc["trace_source"]
    json.dumps(doc, allow_nan=False)


async def test_run_against_a_server_writes_the_summary(
    fake_openai: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse(
        *("--workload", "synthetic", "--rate", "inf", "--max-requests", "3"),
        *("--input-len", "8", "--output-len", "4", "--out", str(tmp_path), "--save-requests"),
        *("--slo-ttft-ms", "10000", "--quiet"),
    )
    args.target = fake_openai.url
    assert await run(args) == 0
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["config"]["model"] == "sim-model"  # found at /v1/models
    assert doc["summary"]["completed"] == 3
    assert doc["summary"]["output_throughput"] > 0
    assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == 3
    assert {r["max_tokens"] for r in fake_openai.requests} == {4}
    assert "TTFT" in capsys.readouterr().out


async def test_run_says_what_to_do_when_the_server_is_down(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert await run(parse("--quiet")) == 2
    assert "--model" in capsys.readouterr().err


def parse_without_target(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fleetgate bench")
    add_arguments(parser)
    return parser.parse_args(argv)


def test_trace_and_compare_flags_exclude_what_they_replace(tmp_path: Path) -> None:
    config = config_from_args(parse("--trace", str(tmp_path / "t.csv"), "--trace-speed", "3"))
    assert config.workload == "trace"
    assert config.trace_file == tmp_path / "t.csv"
    assert config.to_json()["trace_file"] == str(tmp_path / "t.csv")
    with pytest.raises(SystemExit):
        parse("--trace", "t.csv", "--workload", "synthetic")  # one source or the other
    with pytest.raises(SystemExit):
        parse_without_target()  # --target or --compare
    with pytest.raises(SystemExit):
        parse("--compare", "a")  # not both
    assert parse_without_target("--compare", "a", "b").compare == [Path("a"), Path("b")]


async def test_a_trace_file_replays_and_out_writes_plots_and_a_page(
    fake_openai: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "mine.jsonl"
    trace.write_text(
        "".join(
            f'{{"timestamp": {40 * i}, "input_length": 30, "output_length": 5, "hash_ids": [1]}}\n'
            for i in range(6)
        )
    )
    out = tmp_path / "run"
    args = parse("--trace", str(trace), "--out", str(out), "--quiet")
    args.target = fake_openai.url
    assert await run(args) == 0
    assert len(fake_openai.requests) == 6
    assert {r["max_tokens"] for r in fake_openai.requests} == {5}
    doc = json.loads((out / "summary.json").read_text())
    assert doc["config"]["workload"] == "trace"
    assert doc["summary"]["completed"] == 6
    for name in ("latency.png", "throughput.png", "load.png", "index.html"):
        assert (out / name).stat().st_size > 1000, name
    printed = capsys.readouterr().out
    assert "mooncake, 6 requests over 0.2 s" in printed
    assert "index.html" in printed


async def test_a_target_without_metrics_runs_and_says_per_backend_plots_need_a_gateway(
    fake_openai: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse(
        *("--workload", "synthetic", "--rate", "inf", "--max-requests", "3"),
        *("--input-len", "8", "--output-len", "4", "--out", str(tmp_path), "--quiet"),
    )
    args.target = fake_openai.url
    assert await run(args) == 0
    assert fake_openai.not_found == ["/metrics"]  # asked once, then left alone
    assert not (tmp_path / "backends.png").exists()
    assert not (tmp_path / "backends.json").exists()
    need = "per-backend plots need a fleetgate gateway as the target"
    page = (tmp_path / "index.html").read_text()
    assert f"{need} (GET /metrics answered 404)" in page
    assert "backends.png" not in page
    assert need in capsys.readouterr().out.replace("\n", "")


async def test_a_run_against_a_gateway_plots_the_load_on_each_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sims = [{"sim": "h100-llama3-8b"}, {"sim": "h100-llama3-8b"}]
    config = parse_config({"server": {"port": 0}, "pools": [{"model": "m", "backends": sims}]})
    running = await start_gateway(config)
    try:
        args = parse(
            *("--workload", "synthetic", "--rate", "20", "--duration", "3.5", "--seed", "1"),
            *("--input-len", "16", "--output-len", "32", "--out", str(tmp_path), "--quiet"),
        )
        args.target = f"http://127.0.0.1:{running.port}"
        assert await run(args) == 0
        backends = {state.backend.id for state in running.pools["m"].states}
    finally:
        await running.close()
    doc = json.loads((tmp_path / "backends.json").read_text())
    assert doc["interval_s"] == 1.0
    assert set(doc["backends"]) == backends
    answered = 0.0
    for samples in doc["backends"].values():
        at_s, rates = samples["at_s"], samples["answers_per_s"]
        assert len(at_s) >= 5  # a scrape a second for the run's 3.5 s and more, and its end
        assert samples["healthy"] == [True] * len(at_s)
        assert rates[0] is None  # the first scrape has nothing before it
        assert set(samples["errors_per_s"][1:]) == {0.0}
        assert max(samples["in_flight"]) > 0
        answered += sum(r * (b - a) for r, a, b in zip(rates[1:], at_s[:-1], at_s[1:], strict=True))
    # Every answer was counted by one backend: the rates add up to the run's requests (the
    # first scrape came before any answer could, and the last after the run).
    completed = json.loads((tmp_path / "summary.json").read_text())["summary"]["completed"]
    assert completed > 40
    assert answered == pytest.approx(completed, abs=1.5)
    assert_png(tmp_path / "backends.png")
    page = (tmp_path / "index.html").read_text()
    assert '<img src="backends.png"' in page
    assert "need a fleetgate gateway" not in page
    assert "backends.json" in capsys.readouterr().out
    # A run with backends.json compares beside one saved before it existed.
    summary = summarize([RequestRecord(0, 0.0, 0.0, 8, 2, ttft_s=0.1, e2e_s=0.2)], 1.0, Slo())
    write_results(tmp_path / "old", summary, {"workload": "synthetic"})
    assert await run(parse_without_target("--compare", str(tmp_path / "old"), str(tmp_path))) == 0


async def test_a_bad_trace_file_stops_the_run_before_a_request(
    fake_openai: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,2\n1,ten,2\n")
    args = parse("--trace", str(trace), "--quiet")
    args.target = fake_openai.url
    assert await run(args) == 2
    assert fake_openai.requests == []
    err = capsys.readouterr().err
    assert "bad.csv:3: ContextTokens 'ten' is not a whole number" in err.replace("\n", "")
    assert "Traceback" not in err


async def test_compare_prints_saved_runs_without_a_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = summarize([RequestRecord(0, 0.0, 0.0, 8, 2, ttft_s=0.1, e2e_s=0.2)], 1.0, Slo())
    write_results(tmp_path / "a", summary, {"workload": "synthetic"})
    write_results(tmp_path / "b", summary, {"workload": "synthetic"})
    folders = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert await run(parse_without_target("--compare", *folders)) == 0
    assert "1.00x" in capsys.readouterr().out
    assert await run(parse_without_target("--compare", str(tmp_path / "a"), str(tmp_path))) == 2
    assert "no summary.json" in capsys.readouterr().err
