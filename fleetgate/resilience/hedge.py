"""Hedged requests (opt-in per pool): when a stream's first token is late, ask a second backend
and keep whichever answers first.

Late means later than a percentile of the pool's recent TTFTs:
    delay = clamp(percentile_p(last `window` TTFTs), min_delay_s, max_delay_s)
(max_delay_s until 20 TTFTs have been seen). The first backend to produce a token wins the
client; the other attempt is cancelled at that moment, which aborts its upstream request. A
hedge counts against the pool's retry budget while it runs.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from fleetgate.lifecycle.events import FirstToken
from fleetgate.lifecycle.hooks import Hooks
from fleetgate.settings import Settings, at_least, ordered, within

MIN_SAMPLES = 20  # TTFTs needed before the percentile is trusted
_RECOMPUTE_EVERY = 32  # new samples between two sorts of the window


class HedgeSettings(Settings, frozen=True):
    """A pool's `hedge:` section."""

    enabled: bool = False  # opt-in: a hedge costs a second backend's work
    percentile: float = 0.95  # hedge once the first token is later than this share of TTFTs
    min_delay_s: float = 0.05  # never hedge sooner
    max_delay_s: float = 5.0  # never wait longer (and the delay before there is data)
    window: int = 256  # recent TTFTs the percentile is taken over

    def __post_init__(self) -> None:
        within("percentile", self.percentile, 0, 1, open_low=True)
        within("min_delay_s", self.min_delay_s, 0, math.inf, open_low=True)
        ordered("min_delay_s", self.min_delay_s, "max_delay_s", self.max_delay_s)
        at_least("window", self.window, 1)


class TtftWindow:
    """The last `window` TTFTs of a pool's clients and the hedge delay they give; O(1) per
    sample, taken from the pool's FirstToken events."""

    __slots__ = ("_added", "_delay", "_next", "_samples", "_settings")

    def __init__(self, settings: HedgeSettings) -> None:
        self._settings = settings
        self._samples: list[float] = []
        self._next = 0
        self._added = 0
        self._delay = settings.max_delay_s

    def subscribe(self, hooks: Hooks) -> None:
        hooks.subscribe(FirstToken, self.on_first_token)

    def on_first_token(self, event: FirstToken) -> None:
        if event.ttft_s is not None:
            self.add(event.ttft_s)

    def add(self, seconds: float) -> None:
        if len(self._samples) < self._settings.window:
            self._samples.append(seconds)
        else:
            self._samples[self._next] = seconds
            self._next = (self._next + 1) % self._settings.window
        self._added += 1
        if self._added % _RECOMPUTE_EVERY == 0 or len(self._samples) == MIN_SAMPLES:
            self._recompute()

    def _recompute(self) -> None:
        s = self._settings
        if len(self._samples) < MIN_SAMPLES:
            return
        ordered = sorted(self._samples)
        value = ordered[min(len(ordered) - 1, int(s.percentile * len(ordered)))]
        self._delay = min(s.max_delay_s, max(s.min_delay_s, value))

    @property
    def delay_s(self) -> float:
        """How long a first attempt may go without a token before the hedge is sent."""
        return self._delay


class Race:
    """Attempts competing for one client: the first to claim it wins, the others are cancelled."""

    __slots__ = ("tasks", "winner")

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[object]] = []
        self.winner: int | None = None

    def claimer(self, index: int) -> Callable[[], bool]:
        """The claim function of attempt `index`: True if the client is (now) its own."""

        def claim() -> bool:
            if self.winner is None:
                self.winner = index
                for i, task in enumerate(self.tasks):
                    if i != index:
                        task.cancel()
            return self.winner == index

        return claim
