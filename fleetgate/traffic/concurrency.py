"""How many requests a pool may serve at once: fixed, or found by watching its engines.

The adaptive limit looks for the most requests the pool serves without queueing them in the
engines, and moves once per `interval_s`:

    congested   the engines' own queues hold more than `engine_queue` requests per backend
                (their fresh metrics), or the time to first token of the interval's short
                prompts, measured from when each was sent, has its median over `target_ttft_s`
    congested:                       limit = max(minimum, limit * 0.9)
    else, if the limit was reached:  limit * 2 until the first congestion (slow start, as
                                     TCP's); after it, limit * 1.2 + 1 while the median TTFT is
                                     under half its target (far from congestion: a dip after
                                     a burst is won back in seconds), limit * 1.05 + 1 nearer
    else:                            unchanged

Its signals are what the engines said within `stale_after_s` and what the gateway measured
itself: when the engines' metrics go stale it goes on with the TTFTs, and with neither it
keeps its value. It never stops admitting (the minimum is 1 per backend) and never admits
without bound.

The limit is the pool's, whoever admits to it: with several gateways on one shared load board
(shared/load_board.py), each admits up to its share, the limit / the gateways counting on the
board (at least 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fleetgate.fleet.pool import Pool
from fleetgate.lifecycle.events import AttemptEnded
from fleetgate.lifecycle.hooks import Hooks
from fleetgate.settings import Settings, at_least, positive_seconds

_DECREASE = 0.9
_INCREASE_FAR = 1.2  # while the median TTFT is under half its target
_INCREASE = 1.05
_SAMPLES = 512  # TTFTs kept per interval at most


class LimitSettings(Settings, frozen=True):
    """A pool's concurrency limit (`pools[].admission.limit`)."""

    max_in_flight: int | None = None  # a fixed limit for the pool; None: adaptive
    # The adaptive limit's start, per backend: vLLM runs up to 256 sequences at once by default
    # (1,024 on H100), SGLang and TGI about as many. From 32 a cold start under overload
    # spent its first 20 s below the fleet's capacity (goodput 0.84-0.89x of it in five
    # runs of benchmarks/overload.py; 0.92-0.94x from 128). A backend that runs fewer queues
    # them itself, and the limit comes down on that signal (x0.9 a second: 128 to 8 in 26 s).
    initial_per_backend: int = 128
    min_per_backend: int = 1  # it never goes below this, per backend
    max_per_backend: int = 4096  # nor above this
    target_ttft_s: float = 1.0  # median of short prompts' TTFT it keeps under
    short_prompt_tokens: int = 2048  # prompts up to this long (estimated) are judged by TTFT
    engine_queue: float = 2.0  # requests per backend the engines may queue themselves
    interval_s: float = 1.0  # between two moves
    stale_after_s: float = 5.0  # engine metrics older than this are not read

    def __post_init__(self) -> None:
        if self.max_in_flight is not None:
            at_least("max_in_flight", self.max_in_flight, 1)
        at_least("min_per_backend", self.min_per_backend, 1)
        at_least("initial_per_backend", self.initial_per_backend, self.min_per_backend)
        at_least("max_per_backend", self.max_per_backend, self.initial_per_backend)
        positive_seconds("target_ttft_s", self.target_ttft_s)
        at_least("short_prompt_tokens", self.short_prompt_tokens, 1)
        at_least("engine_queue", self.engine_queue, 0)
        positive_seconds("interval_s", self.interval_s)
        positive_seconds("stale_after_s", self.stale_after_s)


class ConcurrencyLimit:
    """The limit of one pool (module docstring). `value` is read on every admission."""

    def __init__(
        self,
        settings: LimitSettings,
        pool: Pool,
        clock: Callable[[], float],
        engine_priority: bool = False,
    ) -> None:
        self._settings = settings
        # With the engines scheduling by priority, critical requests skip their queues: their
        # first tokens say nothing of congestion (half the samples in benchmarks/overload.py,
        # which kept the median low while the others waited and the limit grew to 620).
        self._skip_critical = engine_priority
        self._pool = pool
        self._clock = clock
        n = self._backends = len(pool.states)
        self.fixed = settings.max_in_flight is not None
        start = settings.max_in_flight or settings.initial_per_backend * n
        self._value = float(start)
        self._gateways = 1  # admitting to this pool, as its board last said
        self.value = max(1, start)  # this gateway's share, read on every admission
        pool.board.watch_gateways(self._gateways_changed)
        self._min = settings.min_per_backend * n
        self._max = settings.max_per_backend * n
        pool.resized = self._resized
        self._ttfts: list[float] = []
        self._reached = False
        self._slow_start = True  # until the first congestion: double while reached
        self._next = clock() + settings.interval_s

    def subscribe(self, hooks: Hooks) -> None:
        if not self.fixed:
            hooks.subscribe(AttemptEnded, self.on_attempt_ended)

    def on_attempt_ended(self, event: AttemptEnded) -> None:
        first = event.first_token_at
        if (
            first is not None
            and event.kind in ("first", "retry")
            and event.prompt_tokens <= self._settings.short_prompt_tokens
            and len(self._ttfts) < _SAMPLES
            and not (self._skip_critical and event.priority == 0)
        ):
            self._ttfts.append(first - event.sent_at)

    def reached(self) -> None:
        """The limit held a request back (or was met) since the last move."""
        self._reached = True

    def tick(self, now: float) -> None:
        """Called as requests end: moves the limit once per interval."""
        if now >= self._next and not self.fixed:
            self._move(now)

    def _move(self, now: float) -> None:
        self._next = now + self._settings.interval_s
        median = self._ttft_median()
        if self.congested(now, median):
            self._slow_start = False
            self._value = max(float(self._min), self._value * _DECREASE)
        elif self._reached:
            if self._slow_start:
                grown = self._value * 2
            elif median is None or median < self._settings.target_ttft_s / 2:
                grown = self._value * _INCREASE_FAR + 1
            else:
                grown = self._value * _INCREASE + 1
            self._value = min(float(self._max), grown)
        self._share()
        self._ttfts.clear()
        self._reached = False

    def _share(self) -> None:
        """This gateway's share of the limit, as `value`."""
        self.value = max(1, max(self._min, math.floor(self._value)) // self._gateways)

    def _resized(self, backends: int) -> None:
        """Backends joined or left: the bounds follow their count, and the limit keeps its
        share per backend (a pool that had none starts where one configured so would)."""
        s, old = self._settings, self._backends
        self._backends = backends
        self._min = s.min_per_backend * backends
        self._max = s.max_per_backend * backends
        if not self.fixed:
            grown = self._value * backends / old if old else s.initial_per_backend * backends
            self._value = min(float(self._max), max(float(self._min), grown))
            self._share()

    def close(self) -> None:
        """Replaced (a reloaded config's limit took over its pool): stop hearing its board."""
        self._pool.board.unwatch_gateways(self._gateways_changed)

    def _gateways_changed(self, gateways: int) -> None:
        self._gateways = gateways
        self._share()

    def _ttft_median(self) -> float | None:
        """The interval's median TTFT of short prompts; None with fewer than 5 of them. (The
        median, not a tail: a tail is where the prefills of a burst the limit just let in
        land, and reading it as congestion made the limit shrink from its own growth.)"""
        ttfts = self._ttfts
        if len(ttfts) < 5:
            return None
        ttfts.sort()
        return ttfts[len(ttfts) // 2]

    def congested(self, now: float, median: float | None) -> bool:
        s = self._settings
        if median is not None and median > s.target_ttft_s:
            return True
        waiting, fresh = 0.0, 0
        for state in self._pool.states:
            engine = state.engine
            if engine is not None and now - engine.scraped_at <= s.stale_after_s:
                waiting += engine.waiting
                fresh += 1
        return fresh > 0 and waiting > s.engine_queue * fresh
