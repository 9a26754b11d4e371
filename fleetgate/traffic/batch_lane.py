"""How many batch-lane requests a pool serves at once: as many as leave its interactive
requests' time to first token near the best it has been.

A batch request in an engine's running batch makes every step longer, so the interactive
requests' prefills and tokens wait longer: admission order alone (batch only when no
interactive request waits) let an interactive tenant's TTFT p99 grow 9.6x beside three times
capacity of batch in benchmarks/overload.py. So the lane has a cap of its own, moved once per
`interval_s` from the interval's median TTFT of interactive requests (from each attempt's
send to its first token: the engines' share of it, not the gateway's queue):

    best       the lowest such median of the last `window_s`
    median > best * slack, with batch in flight:   cap = max(minimum, cap * 0.7)
    else, if batch requests waited at the cap:     cap = cap * 1.1 + 1 (never over the share)

With no interactive first tokens in an interval (no interactive traffic) the cap only grows:
batch takes what is spare. The cap never exceeds `batch_share` of the pool's limit nor falls
below one request per backend, so batch work never stops.

The slack trades batch throughput for interactive latency. In benchmarks/overload.py (an
interactive tenant at half the fleet's capacity, batch offered three times it, 60 s each,
with engine priority): slack 1.25 let batch through at 2.9 req/s, interactive TTFT p99 1.18x
its own alone; 1.5: 4.0 and 3.9 req/s, 0.83x and 0.74x; 2.0: 8.3 and 9.4 req/s, 0.93x and
1.47x (p50 39 -> 62 ms). The p99 alone moved between 116 and 197 ms from run to run; 1.5 keeps
the target of 1.5x with a margin.
"""

from __future__ import annotations

from collections import deque

from fleetgate.lifecycle.events import FirstToken
from fleetgate.lifecycle.hooks import Hooks
from fleetgate.settings import Settings, at_least, positive_seconds

_DECREASE = 0.7
_INCREASE = 1.1
_SAMPLES = 512  # first tokens kept per interval at most


class BatchLaneSettings(Settings, frozen=True):
    """The batch lane's own cap (`pools[].admission.batch_lane`)."""

    slack: float = 1.5  # interactive TTFT (median) may be this much over its recent best
    window_s: float = 60.0  # the best is the lowest interval median of this long
    interval_s: float = 1.0  # between two moves

    def __post_init__(self) -> None:
        at_least("slack", self.slack, 1.0)
        positive_seconds("window_s", self.window_s)
        positive_seconds("interval_s", self.interval_s)


class BatchLane:
    """The cap of one pool's batch lane (module docstring); `cap` is read per batch request."""

    def __init__(self, settings: BatchLaneSettings, backends: int, start: float) -> None:
        self._settings = settings
        self._min = float(max(1, backends))
        self.cap = self._min
        self._ttfts: list[float] = []
        self._medians: deque[tuple[float, float]] = deque()  # (when, interval median)
        self._held = False  # batch requests waited at the cap since the last move
        self._next = start + settings.interval_s

    def subscribe(self, hooks: Hooks) -> None:
        hooks.subscribe(FirstToken, self.on_first_token)

    def on_first_token(self, event: FirstToken) -> None:
        if not event.batch and event.kind in ("first", "retry") and len(self._ttfts) < _SAMPLES:
            self._ttfts.append(event.at - event.sent_at)

    def held(self) -> None:
        """A batch request waited with the lane at its cap."""
        self._held = True

    def tick(self, now: float, in_flight: int, ceiling: float) -> None:
        """Called by the admission's tick: moves the cap once per interval; `in_flight` is
        the lane's requests in flight, `ceiling` its share of the pool's limit."""
        if now < self._next:
            return
        self._next = now + self._settings.interval_s
        median = self._median(now)
        best = min(m for _, m in self._medians) if self._medians else None
        if (
            median is not None
            and best is not None
            and in_flight
            and median > best * self._settings.slack
        ):
            self.cap = max(self._min, self.cap * _DECREASE)
        elif self._held:
            self.cap = self.cap * _INCREASE + 1
        self.cap = max(self._min, min(self.cap, ceiling))
        self._held = False

    def _median(self, now: float) -> float | None:
        """The interval's median interactive TTFT (None with fewer than 5), kept for `best`."""
        ttfts, self._ttfts = self._ttfts, []
        medians = self._medians
        while medians and medians[0][0] < now - self._settings.window_s:
            medians.popleft()
        if len(ttfts) < 5:
            return None
        ttfts.sort()
        median = ttfts[len(ttfts) // 2]
        medians.append((now, median))
        return median
