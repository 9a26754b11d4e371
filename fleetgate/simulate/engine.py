"""An engine at the fleet level: the sim worker's engine (workers/sim/engine.py) seen a few
events per request instead of one step at a time, for simulating thousands of replicas.

Same profile, same scheduler in outline, same step-time formula; what changes is the clock's
grain. Between two events (a request arrives, a prompt's prefill completes, an answer ends)
what the engine runs is fixed, so each of its steps schedules the same tokens: one per
decoding sequence, plus a chunk of the prompts waiting for prefill up to the step's budget
(`max_num_batched_tokens`). The engine jumps from event to event:

    tokens per step     = min(budget, decoding + prompt tokens left to prefill)
    step k takes        = overhead + max(weights, tokens * compute) + kv_k * kv_read
    kv_k                = KV tokens the decoding sequences read, growing by one each a step

so k steps take a*k + b*k^2/2 seconds (b = decoding * kv_read), solved for k when an event
comes between steps. Prompts are prefilled first come first served; one completes (its first
token) at the end of the step in which its last chunk is computed; a sequence that got its
first token at step s ends at step s + output - 1. A step counter keeps every sequence's
place, so a decode costs nothing until its sequence ends: a request is three events.

Prompts enter the running batch while fewer than `max_num_seqs` run and their prompt fits the
KV cache beside what is running (else they wait, first come first served). The prefix cache
is an LRU of prompt blocks (`block_tokens` each, a trace's own blocks): a prompt's cached
prefix is not prefilled again. Left out, against the step-level engine: preemption (a cache
that overflows as answers grow is not modelled: admission counts prompts only), priority
scheduling, prompt chunks' attention reads, and the step-level engine's 16-token blocks.
tests/simulate/test_fleet_engine.py compares the two on a sweep of loads.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from fleetgate.fleet.engine_load import StepTotals
from fleetgate.workers.sim.profiles import EngineProfile

STUCK = 10_000  # events due at one instant in a row, at most: more is a bug, not a model


def slowed(profile: EngineProfile, factor: float) -> EngineProfile:
    """`profile` with every step `factor` times as long (1: itself)."""
    if factor == 1.0:
        return profile
    return dataclasses.replace(
        profile, overhead_s=profile.overhead_s * factor,
        weights_time_s=profile.weights_time_s * factor,
        compute_per_token_s=profile.compute_per_token_s * factor,
        kv_read_per_token_s=profile.kv_read_per_token_s * factor,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Job:
    """One generation request as the engine receives it."""

    key: int  # unique among the engine's requests
    prompt_tokens: int
    output_tokens: int  # exactly this many are generated
    blocks: Sequence[int] = ()  # the prompt's block ids, each `block_tokens` long, in order


@dataclass(frozen=True, slots=True)
class Load:
    """What the engine reports, as vLLM's gauges and counters do."""

    running: int
    waiting: int
    kv_usage: float  # 0..1
    prefix_hits: int  # prompt tokens found cached, so far
    prefix_queries: int  # prompt tokens looked up, so far
    step_totals: StepTotals


class _Running:
    __slots__ = ("cached", "decoding", "job", "left", "start")

    def __init__(self, job: Job, cached: int) -> None:
        self.job = job
        self.cached = cached
        self.left: float = job.prompt_tokens - cached  # prompt tokens still to prefill
        self.start = 0.0  # the step counter at its first token (then it decodes)
        self.decoding = False


class FleetEngine:
    """One replica's engine; the caller owns time (`advance`, `next_event_at`)."""

    def __init__(self, profile: EngineProfile, block_tokens: int = 512) -> None:
        self.profile = profile
        self._capacity = profile.kv_capacity_tokens
        self._budget = profile.max_num_batched_tokens
        self._max_seqs = profile.max_num_seqs
        self._block_tokens = block_tokens
        self._cache_blocks = max(1, self._capacity // block_tokens)
        self._t = 0.0  # the time the state is at
        self._empty()

    def _empty(self) -> None:
        """Nothing held, nothing cached (a new engine, or one that crashed)."""
        self._cache: OrderedDict[int, None] = OrderedDict()
        self._waiting: deque[Job] = deque()
        self._arriving: list[Job] = []  # came during a step: they join at its end
        self._prefill: deque[_Running] = deque()
        self._prefill_left = 0.0  # sum of `left` over _prefill
        self._chunk = 0.0  # prompt tokens prefilled a step: set as each step starts
        self._prefill_kv = 0  # prompt tokens of the sequences in prefill (their KV, reserved)
        self._decoding: list[tuple[float, int, _Running]] = []  # (end step, key, run): a heap
        self._ctx_base = 0.0  # decoding KV = _ctx_base + len(decoding) * _steps
        self._dropped: set[int] = set()  # keys aborted while decoding (left in the heap)
        self._by_key: dict[int, _Running | Job] = {}
        self._steps = 0.0  # sequences' places are counted on it; from 0 again when idle
        self._hits = self._queries = 0
        self._step_count = self._tokens = self._gaps = self._gap_s = 0.0  # the totals

    # -- what comes in ----------------------------------------------------------------------

    def add(self, job: Job, now: float) -> None:
        """`job` arrives at `now` (>= the last `advance`'s time: advance first)."""
        if job.key in self._by_key:
            raise ValueError(f"request {job.key} is already in the engine")
        if job.prompt_tokens < 1 or job.output_tokens < 1:
            raise ValueError("a job needs a prompt and at least one output token")
        if job.prompt_tokens + job.output_tokens - 1 > self._capacity:
            raise ValueError(
                f"prompt + max_tokens ({job.prompt_tokens + job.output_tokens - 1}) exceeds the "
                f"KV cache ({self._capacity} tokens)"
            )  # the sim worker's words
        self._by_key[job.key] = job
        if self._running_count():
            if self._steps != math.ceil(self._steps):
                self._arriving.append(job)  # a step is under way: the job joins the next one
                return
        else:  # an idle engine starts a step now, its counts from 0 (no float dust kept)
            self._steps, self._ctx_base = 0.0, 0.0
            self._decoding.clear()
            self._dropped.clear()
        self._t = now
        self._waiting.append(job)
        self._admit()
        self._start_step()

    def abort(self, key: int) -> bool:
        """Drop a request (its client left); False if the engine does not hold it."""
        item = self._by_key.pop(key, None)
        if item is None:
            return False
        if isinstance(item, Job):
            (self._waiting if item in self._waiting else self._arriving).remove(item)
        elif not item.decoding:  # (its last chunk may be done, its step not yet over)
            self._prefill.remove(item)
            self._prefill_left -= item.left
            self._prefill_kv -= item.job.prompt_tokens
        else:
            self._dropped.add(key)
            self._ctx_base -= item.job.prompt_tokens - item.start
        self._admit()
        self._start_step()  # its share of the step under way goes to the others
        return True

    def generated(self, key: int) -> int:
        """Tokens request `key` has generated so far (0 before its first)."""
        item = self._by_key.get(key)
        if not isinstance(item, _Running) or not item.decoding:
            return 0
        return min(item.job.output_tokens, int(self._steps - item.start + 1e-9) + 1)

    def crash(self) -> list[Job]:
        """The engine dies: everything it held is lost (its cache too); what was running."""
        lost = [item if isinstance(item, Job) else item.job for item in self._by_key.values()]
        self._empty()
        return lost

    # -- time -------------------------------------------------------------------------------

    def next_event_at(self) -> float:
        """When the next prefill completes or answer ends, if nothing arrives first (inf:
        idle)."""
        step = self._next()
        if step is None:
            return math.inf
        k, a, b = step
        return self._t + _seconds(k, a, b)

    def advance(self, now: float) -> tuple[list[tuple[Job, float]], list[tuple[Job, float]]]:
        """Run up to `now`: the first tokens and the ends that came by then, with their
        times (an end's job left the engine)."""
        firsts: list[tuple[Job, float]] = []
        ends: list[tuple[Job, float]] = []
        stuck = 0  # events due with no step between: a handful, unless the model is wrong
        while stuck < STUCK:
            step = self._next()
            if step is None:
                self._t = now
                return firsts, ends
            k, a, b = step
            at = self._t + _seconds(k, a, b)
            if at > now:  # the event is later: part of the way, as many steps as fit
                seconds = now - self._t
                self._run(_steps(seconds, a, b), now)
                return firsts, ends
            self._run(k, at)
            self._events(at, firsts, ends)
            stuck = stuck + 1 if k <= 0 else 0
        raise RuntimeError(f"the engine model made no progress at {self._t} s")  # a bug, loudly

    def load(self, now: float) -> Load:
        """The gauges and counters at `now` (no earlier than the last `advance`, and before
        its next event: what a scrape between two events reads)."""
        n = self._decodes()
        steps, count = self._steps, self._step_count
        tokens, gaps, gap_s = self._tokens, self._gaps, self._gap_s
        step = self._next() if now > self._t else None
        if step is not None:  # part of the way to the next event
            _, a, b = step
            seconds = now - self._t
            k = _steps(seconds, a, b)
            steps += k
            count += k
            tokens += (n + self._chunk) * k
            gaps += n * k
            gap_s += n * seconds
        kv = self._ctx_base + n * steps + self._prefill_kv
        return Load(
            self._running_count(), len(self._waiting) + len(self._arriving),
            min(1.0, kv / self._capacity), self._hits, self._queries,
            StepTotals(count, tokens, gaps, gap_s),
        )  # fmt: skip

    @property
    def idle(self) -> bool:
        return not self._by_key

    # -- the model --------------------------------------------------------------------------

    def _decodes(self) -> int:
        """Sequences decoding (aborted ones may still sit in the heap)."""
        return len(self._decoding) - len(self._dropped)

    def _running_count(self) -> int:
        return len(self._prefill) + self._decodes()

    def _next(self) -> tuple[float, float, float] | None:
        """Steps until the next prefill completes or answer ends (None when idle), and the
        step-time terms a, b of the steps until then (k steps take a*k + b*k^2/2)."""
        decoding = self._decoding
        dropped = self._dropped
        while decoding and decoding[0][1] in dropped:  # aborted: off the heap's top
            dropped.discard(heapq.heappop(decoding)[1])
        n = len(decoding) - len(dropped)
        chunk = self._chunk
        steps = self._steps
        k = decoding[0][0] - steps if n else math.inf
        done = steps - math.floor(steps)  # of the step under way (step ends are whole)
        if self._arriving and done:  # the end of the step under way
            k = min(k, 1.0 - done)
        if chunk:
            head = self._prefill[0].left
            # Completes at the end of the step that computes its last token.
            k = min(k, math.ceil(done + head / chunk - 1e-9) - done)
            # The step that would prefill less than a chunk: the chunk is set again there.
            end = done + self._prefill_left / chunk
            last = math.floor(end)
            if end - last > 1e-9 and last - done > 1e-9:
                k = min(k, last - done)
        if k == math.inf:
            return None
        p = self.profile
        compute = (n + chunk) * p.compute_per_token_s
        kv = self._ctx_base + n * steps
        a = p.overhead_s + max(p.weights_time_s, compute) + kv * p.kv_read_per_token_s
        return max(k, 0.0), a, n * p.kv_read_per_token_s

    def _run(self, k: float, until: float) -> None:
        """Run `k` steps (ending at `until`): prefill advances, the counter moves."""
        if k <= 0:
            self._t = until
            return
        n, chunk = self._decodes(), self._chunk
        done = chunk * k
        self._tokens += (n + chunk) * k
        self._gaps += n * k
        self._gap_s += n * (until - self._t)
        for run in self._prefill:
            if done <= 0:
                break
            step = min(run.left, done)
            run.left -= step
            done -= step
            self._prefill_left -= step
        self._step_count += k
        steps = self._steps + k
        whole = round(steps)
        self._steps = whole if abs(steps - whole) < 1e-9 else steps  # at a step's end
        self._t = until

    def _events(self, at: float, firsts: list[tuple[Job, float]],
                ends: list[tuple[Job, float]]) -> None:  # fmt: skip
        """The prefills completed and answers ended at `at`, where the counter is now."""
        prefill = self._prefill
        while prefill and prefill[0].left < 0.5:  # done: tokens are whole, the rest is dust
            run = prefill.popleft()
            self._prefill_left -= run.left
            run.left = 0
            self._prefill_kv -= run.job.prompt_tokens
            run.start, run.decoding = self._steps, True
            firsts.append((run.job, at))
            end = self._steps + run.job.output_tokens - 1
            self._ctx_base += run.job.prompt_tokens - run.start
            heapq.heappush(self._decoding, (end, run.job.key, run))
        if not prefill:
            self._prefill_left = 0.0  # no float dust left behind
        arrived = bool(self._arriving) and self._steps == math.ceil(self._steps)
        if arrived:
            self._waiting.extend(self._arriving)
            self._arriving.clear()
        decoding = self._decoding
        ended = False
        while decoding and decoding[0][0] <= self._steps + 1e-6:
            _, key, run = heapq.heappop(decoding)
            if key in self._dropped:
                self._dropped.discard(key)
                continue
            self._ctx_base -= run.job.prompt_tokens - run.start
            del self._by_key[key]
            ends.append((run.job, at))
            ended = True
        if ended or firsts or arrived:
            self._admit()
        self._start_step()

    def _start_step(self) -> None:
        """A step starts: what it prefills is set for its length."""
        n = self._decodes()
        self._chunk = max(0.0, min(self._budget - n, self._prefill_left)) if self._prefill else 0.0

    def _admit(self) -> None:
        """Waiting prompts into the running batch while they fit (first come first served)."""
        waiting = self._waiting
        while waiting and self._running_count() < self._max_seqs:
            job = waiting[0]
            n = self._decodes()
            used = self._ctx_base + n * self._steps + self._prefill_kv
            if used + job.prompt_tokens > self._capacity and self._running_count():
                return
            waiting.popleft()
            cached = min(self._cached(job.blocks), job.prompt_tokens - 1)
            self._queries += job.prompt_tokens
            self._hits += cached
            run = _Running(job, cached)
            self._by_key[job.key] = run
            self._prefill.append(run)
            self._prefill_left += run.left
            self._prefill_kv += job.prompt_tokens

    def _cached(self, blocks: Sequence[int]) -> int:
        """Tokens of the prompt's prefix in the cache; its blocks become the newest."""
        cache = self._cache
        hits = len(blocks)  # until a block is missing
        for i, block in enumerate(blocks):
            if block in cache:
                cache.move_to_end(block)
            else:
                cache[block] = None  # (new: the newest)
                hits = min(hits, i)
        while len(cache) > self._cache_blocks:
            cache.popitem(last=False)
        return hits * self._block_tokens


def _seconds(k: float, a: float, b: float) -> float:
    """How long k steps take when the first takes `a` and each adds `b` (module docstring)."""
    return a * k + b * k * k / 2


def _steps(seconds: float, a: float, b: float) -> float:
    """How many steps fit in `seconds`: `_seconds` inverted."""
    return seconds / a if b <= 0 else (math.sqrt(a * a + 2 * b * seconds) - a) / b
