"""The fleet-level engine (simulate/engine.py) against the sim worker's step-level engine
(workers/sim/engine.py) on the same arrivals, over a sweep of loads from idle to saturated, and
its own rules: the prefix cache, aborts, crashes, what it reports."""

from __future__ import annotations

import math
import random

import pytest

from fleetgate.simulate.engine import FleetEngine, Job
from fleetgate.workers.sim.engine import Engine, EngineRequest
from fleetgate.workers.sim.profiles import get_profile
from fleetgate.workers.sim.prompt import PromptBlocks

H100 = get_profile("h100-llama3-8b")
Arrival = tuple[float, int, int]  # when, prompt tokens, output tokens
Times = dict[int, tuple[float, float]]  # request -> (TTFT, E2E)


def arrivals(rate: float, count: int, prompt: int, output: int, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append((t, int(prompt * rng.uniform(0.5, 1.5)), int(output * rng.uniform(0.5, 1.5))))
    return out


def step_level(arrived: list[Arrival]) -> Times:
    """Each request's times on the step-level engine, stepped back to back."""
    engine, now, i, times = Engine(H100), 0.0, 0, {}
    while i < len(arrived) or engine.has_work():
        if not engine.has_work():
            now = max(now, arrived[i][0])
        while i < len(arrived) and arrived[i][0] <= now:
            at, prompt, output = arrived[i]
            # Fresh prompts: block hashes no other request has.
            blocks = PromptBlocks(prompt, 16, tuple(range(i << 20, (i << 20) + prompt // 16)))
            engine.add_request(EngineRequest(str(i), blocks, output, at))
            i += 1
        result = engine.step(now)
        now += result.duration_s
        for done in result.finished:
            times[int(done.request_id)] = (
                done.first_token_s - done.arrival_s, done.finish_s - done.arrival_s
            )  # fmt: skip
    return times


def fleet_level(arrived: list[Arrival]) -> Times:
    """Each request's times on the fleet-level engine, event to event."""
    engine, firsts, times = FleetEngine(H100), {}, {}

    def run_to(now: float) -> None:
        started, ended = engine.advance(now)
        for job, at in started:
            firsts[job.key] = at - arrived[job.key][0]
        for job, at in ended:
            times[job.key] = (firsts[job.key], at - arrived[job.key][0])

    for key, (at, prompt, output) in enumerate(arrived):
        run_to(at)
        engine.add(Job(key, prompt, output), at)
    run_to(math.inf)
    return times


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


@pytest.mark.parametrize(
    ("prompt", "output", "rate"),
    [
        (1000, 300, 5.0), (1000, 300, 15.0), (1000, 300, 20.0),  # chat: light to busy
        (2000, 30, 10.0), (2000, 30, 20.0),  # long prompts, short answers: to saturation
    ],
)  # fmt: skip
def test_the_fleet_engine_times_requests_as_the_step_level_engine_does(
    prompt: int, output: int, rate: float
) -> None:
    arrived = arrivals(rate, 600, prompt, output, seed=1)
    steps, fleet = step_level(arrived), fleet_level(arrived)
    assert steps.keys() == fleet.keys() == set(range(len(arrived)))
    for figure in (0, 1):  # TTFT, E2E
        for q in (0.5, 0.9):
            expected = quantile([t[figure] for t in steps.values()], q)
            got = quantile([t[figure] for t in fleet.values()], q)
            assert got == pytest.approx(expected, rel=0.05), (figure, q)


def test_a_cached_prefix_is_not_prefilled_again() -> None:
    engine = FleetEngine(H100, block_tokens=512)
    engine.add(Job(0, 4096, 1, blocks=tuple(range(8))), 0.0)
    ((_, first_done),), _ = engine.advance(10.0)
    engine.add(Job(1, 4096, 1, blocks=tuple(range(8))), 10.0)  # the same 8 blocks
    ((_, second_done),), _ = engine.advance(20.0)
    assert first_done == pytest.approx(H100.step_time(4096, 0), rel=0.01)
    # Only the last token is computed: a decode-sized step.
    assert second_done - 10.0 == pytest.approx(H100.step_time(1, 0), rel=0.01)
    load = engine.load(20.0)
    assert (load.prefix_queries, load.prefix_hits) == (8192, 4095)


def test_an_answer_ends_output_minus_one_steps_after_its_first_token() -> None:
    engine = FleetEngine(H100)
    engine.add(Job(0, 100, 11), 0.0)
    ((job, first),), ((same, end),) = engine.advance(1.0)
    assert job.key == same.key == 0
    # Ten decode steps of one sequence, each reading its growing context.
    decodes = sum(H100.step_time(1, 100 + i) for i in range(1, 11))
    assert end - first == pytest.approx(decodes, rel=0.01)


def test_an_abort_frees_the_request_wherever_it_is() -> None:
    engine = FleetEngine(H100)
    engine.add(Job(0, 8000, 500), 0.0)
    engine.add(Job(1, 8000, 500), 0.0)
    engine.advance(0.5)  # both prefilled, decoding
    assert engine.abort(0) and not engine.abort(0)
    assert engine.load(0.5).running == 1
    _, ended = engine.advance(100.0)
    assert [job.key for job, _ in ended] == [1]
    assert engine.idle


def test_a_request_arriving_during_a_step_joins_the_next() -> None:
    engine = FleetEngine(H100)
    engine.add(Job(0, 1000, 300), 0.0)  # a 28 ms prefill step starts
    engine.advance(0.01)
    engine.add(Job(1, 1000, 300), 0.01)
    firsts, _ = engine.advance(1.0)
    times = {job.key: at for job, at in firsts}
    assert times[0] == pytest.approx(H100.step_time(1000, 0), rel=0.01)  # not slowed by it
    assert times[1] > times[0]


def test_a_crash_loses_every_request_and_the_cache() -> None:
    engine = FleetEngine(H100)
    for key in range(3):
        engine.add(Job(key, 2000, 100, blocks=(key,)), 0.0)
    engine.advance(0.05)
    assert sorted(job.key for job in engine.crash()) == [0, 1, 2]
    assert engine.idle and engine.next_event_at() == math.inf
    engine.add(Job(9, 2000, 1, blocks=(0,)), 1.0)
    assert engine.load(1.0).prefix_hits == 0


def test_prompts_wait_while_the_kv_cache_is_full() -> None:
    engine = FleetEngine(H100)
    half = H100.kv_capacity_tokens // 2 + 1
    engine.add(Job(0, half, 1000), 0.0)
    engine.add(Job(1, half, 1000), 0.0)  # does not fit beside the first
    load = engine.load(0.0)
    assert (load.running, load.waiting) == (1, 1)
    assert load.kv_usage == pytest.approx(half / H100.kv_capacity_tokens)


@pytest.mark.parametrize("job", [Job(0, 0, 5), Job(0, 5, 0)])
def test_an_empty_prompt_or_answer_is_refused(job: Job) -> None:
    with pytest.raises(ValueError, match="at least one output token"):
        FleetEngine(H100).add(job, 0.0)


def test_a_reading_between_events_counts_the_steps_run_since_the_last() -> None:
    engine = FleetEngine(H100)
    engine.add(Job(0, 100, 1000), 0.0)
    engine.advance(0.5)
    step = H100.step_time(1, 100)  # about 4.6 ms a decode step
    later = engine.load(1.5)  # no event in between: the engine is not advanced
    first = engine.load(0.5)
    assert later.step_totals.steps - first.step_totals.steps == pytest.approx(1.0 / step, rel=0.02)
    assert later.kv_usage > first.kv_usage  # the answer grew meanwhile
    assert later.step_totals.gap_s - first.step_totals.gap_s == pytest.approx(1.0)


def test_a_prompt_whose_prefill_ended_mid_step_is_aborted_as_a_prefill() -> None:
    engine = FleetEngine(H100)
    engine.add(Job(1, 100, 20), 0.0)
    engine.add(Job(2, 5000, 20), 0.0)  # one step prefills both; job 1's part ends first
    engine.advance(H100.step_time(5100, 0) / 2)
    assert engine.abort(1)
    _, ended = engine.advance(10.0)
    assert [job.key for job, _ in ended] == [2]
    assert engine.idle and engine.load(10.0).kv_usage == 0.0


def test_any_mix_of_arrivals_and_aborts_leaves_the_engine_empty_and_consistent() -> None:
    rng = random.Random(7)
    engine, now, held, finished = FleetEngine(H100), 0.0, set(), set()
    for key in range(3000):
        now += rng.expovariate(40.0)
        _, ended = engine.advance(now)
        finished |= {job.key for job, _ in ended}
        engine.add(Job(key, rng.randint(1, 4000), rng.randint(1, 200)), now)
        held.add(key)
        if rng.random() < 0.3:  # an abort at any moment of any request's life
            victim = rng.choice(sorted(held - finished))
            assert engine.abort(victim)
            held.discard(victim)
    _, ended = engine.advance(math.inf)
    finished |= {job.key for job, _ in ended}
    assert held <= finished and engine.idle
    load = engine.load(math.inf)
    assert (load.running, load.waiting, load.kv_usage) == (0, 0, 0.0)


def test_hours_of_steps_neither_hang_nor_lose_a_request() -> None:
    engine = FleetEngine(H100)
    engine.add(Job(0, 100, 400_000), 0.0)  # keeps the engine busy: its step counter only grows
    engine.advance(1.0)
    engine._steps += 3e6  # as after hours busy
    rng, now, ended = random.Random(3), 1.0, 0
    for key in range(1, 2000):
        now += rng.expovariate(20.0)
        ended += len(engine.advance(now)[1])
        engine.add(Job(key, rng.randint(500, 3000), rng.randint(1, 50)), now)
    ended += len(engine.advance(now + 600.0)[1])
    assert ended == 2000  # the first's end was jumped past with the counter: it ended too
