"""The engine's scheduling: continuous batching, chunked prefill, preemption, prefix cache."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from fleetgate.workers.sim.engine import Engine, EngineRequest, FinishedRequest
from fleetgate.workers.sim.profiles import EngineProfile, get_profile
from fleetgate.workers.sim.prompt import from_text, synthetic

# A step takes exactly one second per token scheduled, so durations show the batch size.
COUNTING = EngineProfile(
    name="counting",
    description="1 s per token in the step, nothing else",
    overhead_s=0.0,
    weights_time_s=0.0,
    compute_per_token_s=1.0,
    kv_read_per_token_s=0.0,
    num_gpu_blocks=1000,
    block_size=4,
    max_num_seqs=8,
    max_num_batched_tokens=64,
)


def _request(rid: str, prompt_tokens: int, max_tokens: int, at: float = 0.0) -> EngineRequest:
    return EngineRequest(rid, synthetic(prompt_tokens, COUNTING.block_size, rid), max_tokens, at)


class _Run:
    """Steps an engine in virtual time, recording what each step made visible."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.t = 0.0
        self.durations: list[float] = []
        self.emitted: Counter[str] = Counter()
        self.finished: dict[str, FinishedRequest] = {}

    def step(self) -> list[str]:
        result = self.engine.step(self.t)
        self.t += result.duration_s
        self.durations.append(result.duration_s)
        self.emitted.update(result.emitted)
        self.finished.update((f.request_id, f) for f in result.finished)
        return list(result.emitted)

    def drain(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.engine.has_work():
                return
            self.step()
        raise AssertionError("engine did not drain")


def test_a_request_joins_a_running_batch() -> None:
    run = _Run(Engine(COUNTING))
    run.engine.add_request(_request("a", 8, 10))
    assert run.step() == ["a"]  # prefill of 8 tokens emits the first token
    assert run.durations[-1] == 8
    run.step()
    run.engine.add_request(_request("b", 8, 10, at=run.t))
    assert run.step() == ["a", "b"]  # a decodes while b prefills, in one step
    assert run.durations[-1] == 1 + 8
    assert run.step() == ["a", "b"]
    assert run.durations[-1] == 2
    run.drain()
    assert run.finished["a"].output_tokens == run.finished["b"].output_tokens == 10


def test_chunked_prefill_shares_the_token_budget() -> None:
    run = _Run(Engine(COUNTING))
    run.engine.add_request(_request("a", 4, 100))
    run.step()
    run.engine.add_request(_request("long", 150, 5))
    emitted = [run.step() for _ in range(3)]
    # Budget 64: a's decode takes 1, the 150-token prompt 63 + 63 + 24.
    assert run.durations[1:] == [64, 64, 25]
    assert emitted == [["a"], ["a"], ["a", "long"]]
    run.drain()
    assert max(run.durations) <= COUNTING.max_num_batched_tokens


def test_max_num_seqs_caps_the_batch() -> None:
    run = _Run(Engine(dataclasses.replace(COUNTING, max_num_seqs=2)))
    for rid in "abc":
        run.engine.add_request(_request(rid, 4, 3))
    assert run.step() == ["a", "b"]
    assert run.engine.stats().num_waiting == 1
    run.drain()
    assert run.finished["c"].first_token_s > run.finished["a"].finish_s - 1e-9


def test_preempted_sequence_recomputes_and_still_gets_every_token() -> None:
    # 10 blocks of 4 tokens; two sequences peaking at 8 + 19 = 27 tokens (7 blocks) each.
    tiny = dataclasses.replace(COUNTING, num_gpu_blocks=10)
    run = _Run(Engine(tiny))
    run.engine.add_request(_request("old", 8, 20))
    run.engine.add_request(_request("new", 8, 20))
    run.drain()
    old, new = run.finished["old"], run.finished["new"]
    assert old.num_preemptions == 0
    assert new.num_preemptions >= 1  # the newest is the one preempted
    assert run.emitted == {"old": 20, "new": 20}  # recomputation emits nothing twice
    assert old.output_tokens == new.output_tokens == 20
    assert new.finish_s > old.finish_s
    stats = run.engine.stats()
    assert stats.num_preemptions_total == new.num_preemptions
    assert stats.kv_usage == 0.0


def test_a_sequence_that_cannot_grow_preempts_itself_when_newest() -> None:
    tiny = dataclasses.replace(COUNTING, num_gpu_blocks=4)
    run = _Run(Engine(tiny))
    run.engine.add_request(_request("a", 4, 9))  # 1 block, peaks at 12 tokens: 3 blocks
    run.engine.add_request(_request("b", 6, 9))  # 2 blocks, peaks at 14 tokens: 4 blocks
    # a takes the last free block at its 5th token; b, newest, then needs one at its 9th.
    run.drain()
    assert run.emitted == {"a": 9, "b": 9}
    assert run.finished["a"].num_preemptions == 0
    assert run.finished["b"].num_preemptions >= 1


def test_prefix_cache_cuts_the_second_identical_prompt_ttft() -> None:
    profile = get_profile("h100-llama3-8b")
    prompt = from_text(" the" * 3000, profile.block_size)
    run = _Run(Engine(profile))
    run.engine.add_request(EngineRequest("cold", prompt, 4, 0.0))
    run.drain()
    run.engine.add_request(EngineRequest("warm", prompt, 4, run.t))
    run.drain()
    cold, warm = run.finished["cold"], run.finished["warm"]
    assert cold.cached_tokens == 0
    # Whole blocks, and never the last token: 3000 tokens -> 187 full blocks of 16 = 2992.
    assert warm.cached_tokens == 2992
    cold_ttft = cold.first_token_s - cold.arrival_s
    warm_ttft = warm.first_token_s - warm.arrival_s
    assert warm_ttft < cold_ttft / 3
    stats = run.engine.stats()
    assert stats.prefix_cache_queries_tokens == 6000
    assert stats.prefix_cache_hits_tokens == 2992


def test_abort_frees_blocks_and_forgets_the_request() -> None:
    run = _Run(Engine(COUNTING))
    run.engine.add_request(_request("a", 40, 50))
    run.engine.add_request(_request("b", 40, 50))  # prefills 24 of 40 in the first step
    run.engine.add_request(_request("queued", 4, 5))  # no budget left for it
    run.step()
    assert run.engine.stats().num_waiting == 1
    assert run.engine.stats().kv_usage > 0
    assert run.engine.abort("a")
    assert run.engine.abort("queued")
    assert run.engine.abort("b")
    assert not run.engine.abort("a")
    stats = run.engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (0, 0, 0.0)
    assert not run.engine.has_work()
    assert run.engine.step(run.t).duration_s == 0.0


def test_counters_add_up() -> None:
    run = _Run(Engine(COUNTING))
    sizes = {"a": (5, 3), "b": (17, 1), "c": (9, 12)}
    for rid, (prompt, out) in sizes.items():
        run.engine.add_request(_request(rid, prompt, out))
    run.drain()
    stats = run.engine.stats()
    assert stats.prompt_tokens_total == 5 + 17 + 9
    assert stats.generation_tokens_total == sum(run.emitted.values()) == 3 + 1 + 12
    assert stats.request_success_total == 3
    assert {rid: f.output_tokens for rid, f in run.finished.items()} == {
        rid: out for rid, (_, out) in sizes.items()
    }
    for f in run.finished.values():
        assert f.arrival_s <= f.first_token_s <= f.finish_s


def test_itl_matches_the_profile_decode_step() -> None:
    profile = get_profile("h100x2-llama3-70b-fp8")
    run = _Run(Engine(profile))
    run.engine.add_request(EngineRequest("a", synthetic(100, 16, "a"), 3, 0.0))
    run.drain()
    assert run.durations[1] == pytest.approx(profile.step_time(1, 101))


def test_add_request_rejects_what_could_never_run() -> None:
    engine = Engine(COUNTING)
    engine.add_request(_request("a", 4, 1))
    with pytest.raises(ValueError, match="already"):
        engine.add_request(_request("a", 4, 1))
    with pytest.raises(ValueError, match="max_tokens"):
        engine.add_request(_request("z", 4, 0))
    with pytest.raises(ValueError, match="exceeds the KV cache"):
        engine.add_request(_request("huge", 4000, 10))
    with pytest.raises(ValueError, match="block size"):
        engine.add_request(EngineRequest("b", synthetic(4, 16, "b"), 1, 0.0))


def test_flush_prefix_cache_refuses_while_busy() -> None:
    run = _Run(Engine(COUNTING))
    run.engine.add_request(_request("a", 12, 2))
    assert not run.engine.flush_prefix_cache()
    run.drain()
    assert run.engine.flush_prefix_cache()
    run.engine.add_request(_request("a", 12, 2))
    run.drain()
    assert run.finished["a"].cached_tokens == 0


def test_kv_received_from_a_prefill_engine_leaves_only_the_last_token_to_compute() -> None:
    profile = get_profile("h100-llama3-8b")
    prompt = from_text(" the" * 3000, profile.block_size)
    prefill, decode = _Run(Engine(profile)), _Run(Engine(profile))
    prefill.engine.add_request(EngineRequest("p", prompt, 1, 0.0))
    prefill.drain()
    assert decode.engine.receive_kv(prompt) == 187  # every full block of the prompt
    decode.engine.add_request(EngineRequest("d", prompt, 4, 0.0))
    decode.drain()
    done = decode.finished["d"]
    assert done.cached_tokens == 2992
    assert done.first_token_s < prefill.finished["p"].first_token_s / 3


# -- priority scheduling (vLLM's --scheduling-policy priority) -----------------------------


def _ranked(rid: str, prompt_tokens: int, max_tokens: int, priority: int) -> EngineRequest:
    prompt = synthetic(prompt_tokens, COUNTING.block_size, rid)
    return EngineRequest(rid, prompt, max_tokens, 0.0, priority)


def test_with_priority_scheduling_a_later_urgent_request_is_admitted_first() -> None:
    full = dataclasses.replace(COUNTING, max_num_seqs=2)
    for policy, last in ((True, "b2"), (False, "urgent")):
        run = _Run(Engine(full, priority_scheduling=policy))
        for rid in ("a1", "a2"):  # the batch is full with these two
            run.engine.add_request(_ranked(rid, 4, 3, 1 if policy else 0))
        run.step()
        for rid in ("b1", "b2"):
            run.engine.add_request(_ranked(rid, 4, 3, 1 if policy else 0))
        run.engine.add_request(_ranked("urgent", 4, 3, 0))
        run.drain()
        # Once a1 and a2 finish, two are admitted: by priority, then arrival (FIFO without).
        first = {r: run.finished[r].first_token_s for r in ("b1", "b2", "urgent")}
        assert max(first, key=first.__getitem__) == last
        assert sorted(first.values())[1] < first[last]


def test_with_priority_scheduling_the_lowest_priority_is_preempted_not_the_newest() -> None:
    tiny = dataclasses.replace(COUNTING, num_gpu_blocks=10)
    for policy, victim in ((True, "low"), (False, "high")):
        run = _Run(Engine(tiny, priority_scheduling=policy))
        run.engine.add_request(_ranked("low", 8, 20, 2 if policy else 0))
        run.engine.add_request(_ranked("high", 8, 20, 0))  # newer, more urgent
        run.drain()
        spared = "high" if victim == "low" else "low"
        assert run.finished[victim].num_preemptions >= 1
        assert run.finished[spared].num_preemptions == 0
        assert run.emitted == {"low": 20, "high": 20}


def test_a_priority_without_priority_scheduling_is_refused_as_vllm_does() -> None:
    engine = Engine(COUNTING)
    with pytest.raises(ValueError, match="Priority scheduling is not enabled"):
        engine.add_request(_ranked("x", 4, 2, 1))
