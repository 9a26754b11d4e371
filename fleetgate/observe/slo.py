"""Service level objectives per pool, evaluated continuously from the requests' Finished events,
with multi-window error-budget burn rates as the Google SRE workbook alerts on them.

An objective of the ratio kind says which share of requests must be good:

    ttft          a stream's first token within `ttft_s`, for `ttft_percentile`% of streams
    tpot          a stream's time per output token after its first, (end - first token) /
                  (output tokens - 1), within `tpot_s`, for `tpot_percentile`% of streams
                  (of two tokens or more); with ttft, the pair DistServe's goodput counts
    e2e           an answer within `e2e_s`, for `e2e_percentile`% of answers
    availability  a share of requests answered without a 5xx (the gateway's own 503 when it
                  sheds, and its 502/504, included); 4xx are the client's and not counted

    error budget  = 1 - target                     (target: 0.99 for a p99 objective)
    burn rate     = bad share in a window / (1 - target)
                    1: the budget lasts exactly the period (`period_days`, 30 by default)

An alert fires while the burn rate over a long window and a short one are both over a
factor (the workbook's table, for a 30-day budget; windows scale with `period_days`):

    page    1 h and 5 min over 14.4  (2% of the budget in an hour)
    page    6 h and 30 min over 6    (5% in six hours)
    ticket  24 h and 2 h over 3      (10% in a day)

A mean objective (`mean_e2e_s`) has no budget: its figure is the mean over `window_s`, and
its "burn" the ratio of that mean to the bound (over 1: not met).

Counts are kept per time slot (`period_days` / 30 * 10 s wide), in a ring as long as the
longest window: a request costs one slot's update per objective; windows are summed when
read (metrics, the admin API, the dashboard), once a second at most.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import msgspec

from fleetgate.lifecycle.events import Finished
from fleetgate.lifecycle.hooks import Hooks
from fleetgate.settings import Settings, positive_seconds, within

_SLOT_S = 10.0  # a slot's width for a 30-day budget
_DAY_S = 86_400.0


class SloSettings(Settings, frozen=True):
    """A pool's objectives (`pools[].slo`); each is off until its bound is given."""

    ttft_s: float | None = None  # a stream's first token within this...
    ttft_percentile: float = 99.0  # ...for this share of streams (ttft p99 <= ttft_s)
    tpot_s: float | None = None  # a stream's mean time per output token within this...
    tpot_percentile: float = 99.0  # ...for this share of streams
    e2e_s: float | None = None  # an answer's end within this...
    e2e_percentile: float = 99.0  # ...for this share of answers
    mean_e2e_s: float | None = None  # the mean time to a whole answer over `window_s`
    availability: float | None = None  # share of requests answered without a 5xx, e.g. 0.999
    window_s: float = 300.0  # the window each objective's figure is reported over
    period_days: float = 30.0  # the error budget's period: burn rate 1 spends it in this

    def __post_init__(self) -> None:
        for name, bound in (("ttft_s", self.ttft_s), ("tpot_s", self.tpot_s),
                            ("e2e_s", self.e2e_s), ("mean_e2e_s", self.mean_e2e_s)):  # fmt: skip
            if bound is not None:
                positive_seconds(name, bound)
        percentiles = (self.ttft_percentile, self.tpot_percentile, self.e2e_percentile)
        for name, value in zip(("ttft_percentile", "tpot_percentile", "e2e_percentile"),
                               percentiles, strict=True):  # fmt: skip
            within(name, value, 0, 100, open_low=True)
        if 100 in percentiles:
            raise ValueError("a percentile of 100 leaves no error budget: give at most 99.99")
        if self.availability is not None:
            within("availability", self.availability, 0, 1, open_low=True)
            if self.availability == 1:
                raise ValueError("`availability` 1 leaves no error budget: give at most 0.9999")
        positive_seconds("window_s", self.window_s)
        within("period_days", self.period_days, 1 / 24, 366)
        if self.window_s > self.period_days * _DAY_S / 30:
            raise ValueError("`window_s` must be at most a 30th of `period_days`")

    @property
    def any(self) -> bool:
        bounds = (self.ttft_s, self.tpot_s, self.e2e_s, self.mean_e2e_s, self.availability)
        return any(bound is not None for bound in bounds)


@dataclass(frozen=True, slots=True)
class BurnAlert:
    """A pair of windows whose burn rates must both be over `factor` (SRE workbook)."""

    severity: str
    long_s: float
    short_s: float
    factor: float


_ALERTS_30D = (
    BurnAlert("page", 3600.0, 300.0, 14.4),
    BurnAlert("page", 21_600.0, 1800.0, 6.0),
    BurnAlert("ticket", 86_400.0, 7200.0, 3.0),
)


def burn_alerts(period_days: float) -> tuple[BurnAlert, ...]:
    """The workbook's alerts, their windows scaled to a budget of `period_days`."""
    scale = period_days / 30.0
    return tuple(
        BurnAlert(a.severity, a.long_s * scale, a.short_s * scale, a.factor) for a in _ALERTS_30D
    )


def fastest_burn(objectives: list[ObjectiveStatus]) -> float | None:
    """The highest burn rate of `objectives` over each one's shortest window (None: none has
    one): how fast an SLO fails now, for the autoscaler (autoscale/scaler.py)."""
    burns = [min(o.burn.items(), key=lambda kv: _window_seconds(kv[0]))[1]
             for o in objectives if o.burn]  # fmt: skip
    return max(burns) if burns else None


def _window_seconds(label: str) -> float:
    """A window's label (`window_label`: 90s, 5m, 1h, 3d) in seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": _DAY_S}
    return float(label[:-1]) * units[label[-1]]


def window_label(seconds: float) -> str:
    """A window's name in metrics and JSON: 5m, 1h, 6h, 90s..."""
    for unit, size in (("d", _DAY_S), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


class _Ring:
    """Two sums per time slot (good and all; or a mean's sum and count) over `slots` slots."""

    __slots__ = ("_a", "_b", "_stamp", "slots", "width")

    def __init__(self, slots: int, width: float) -> None:
        self.slots, self.width = slots, width
        self._a = [0.0] * slots
        self._b = [0.0] * slots
        self._stamp = [-1] * slots  # the slot number each cell holds

    def add(self, at: float, a: float, b: float) -> None:
        index = int(at // self.width)
        cell = index % self.slots
        if self._stamp[cell] != index:
            self._stamp[cell], self._a[cell], self._b[cell] = index, 0.0, 0.0
        self._a[cell] += a
        self._b[cell] += b

    def sums(self, now: float, windows: Iterable[float]) -> dict[float, tuple[float, float]]:
        """(a, b) summed over each window ending now (the slot now in progress included)."""
        current = int(now // self.width)
        spans = sorted((max(1, round(w / self.width)), w) for w in windows)
        out: dict[float, tuple[float, float]] = {}
        a = b = 0.0
        back = 0
        for span, window in spans:
            while back < min(span, self.slots):
                index = current - back
                cell = index % self.slots
                if self._stamp[cell] == index:
                    a += self._a[cell]
                    b += self._b[cell]
                back += 1
            out[window] = (a, b)
        return out


class ObjectiveStatus(msgspec.Struct):
    """One objective as it stands: what it asks, the figure over `window_s`, burn per window,
    alerts firing. `met`: the figure over `window_s` meets it (True with no requests)."""

    name: str
    kind: str  # ratio or mean
    target: float  # a share (ratio) or seconds (mean)
    value: float | None  # good share, or mean seconds, over window_s (None: no requests)
    requests: int  # over window_s
    met: bool
    burn: dict[str, float]  # window label -> burn rate
    alerts: list[str]  # severities firing ("page", "ticket")
    good_total: int = 0  # requests judged good since start (ratio)
    bad_total: int = 0  # and bad


class _Objective:
    """One objective's counts; `good` tells a Finished request's verdict (None: not counted)."""

    def __init__(
        self,
        name: str,
        kind: str,
        target: float,
        judge: Callable[[Finished], float | None],
        ring: _Ring,
    ) -> None:
        self.name, self.kind, self.target = name, kind, target
        self.judge = judge  # ratio: 1.0 good / 0.0 bad; mean: the seconds; None: not counted
        self.ring = ring
        self.good = 0  # since start (ratio): for the fleetgate_slo_requests counter
        self.bad = 0

    def record(self, event: Finished) -> None:
        verdict = self.judge(event)
        if verdict is None:
            return
        self.ring.add(event.at, verdict, 1.0)
        if self.kind == "ratio":
            if verdict:
                self.good += 1
            else:
                self.bad += 1

    def status(self, now: float, window_s: float, alerts: tuple[BurnAlert, ...]) -> ObjectiveStatus:
        if self.kind == "mean":
            (total, count), = self.ring.sums(now, (window_s,)).values()  # fmt: skip
            mean = total / count if count else None
            burn = {window_label(window_s): 0.0 if mean is None else mean / self.target}
            met = mean is None or mean <= self.target
            return ObjectiveStatus(
                name=self.name,
                kind="mean",
                target=self.target,
                value=mean,
                requests=int(count),
                met=met,
                burn=burn,
                alerts=[],
            )
        windows = {window_s, *(a.long_s for a in alerts), *(a.short_s for a in alerts)}
        sums = self.ring.sums(now, windows)
        budget = 1.0 - self.target
        rates = {w: _burn(good, total, budget) for w, (good, total) in sums.items()}
        good, total = sums[window_s]
        share = good / total if total else None
        firing = sorted(
            {a.severity for a in alerts if min(rates[a.long_s], rates[a.short_s]) >= a.factor}
        )
        burn = {window_label(w): rates[w] for w in sorted(rates)}
        met = share is None or share >= self.target
        return ObjectiveStatus(
            name=self.name,
            kind="ratio",
            target=self.target,
            value=share,
            requests=int(total),
            met=met,
            burn=burn,
            alerts=firing,
            good_total=self.good,
            bad_total=self.bad,
        )


def _burn(good: float, total: float, budget: float) -> float:
    return (total - good) / total / budget if total else 0.0


class PoolSlo:
    """A pool's objectives."""

    def __init__(self, settings: SloSettings) -> None:
        self.settings = s = settings
        self.alerts = burn_alerts(s.period_days)
        width = _SLOT_S * s.period_days / 30.0
        longest = max(s.window_s, *(a.long_s for a in self.alerts))
        slots = math.ceil(longest / width) + 1
        self.objectives: list[_Objective] = []
        if s.ttft_s is not None:
            bound = s.ttft_s
            self._ratio(f"ttft_p{s.ttft_percentile:g}", s.ttft_percentile / 100,
                        lambda e: None if e.ttft_s is None else float(e.ttft_s <= bound),
                        slots, width)  # fmt: skip
        if s.tpot_s is not None:
            bound_tpot = s.tpot_s
            self._ratio(f"tpot_p{s.tpot_percentile:g}", s.tpot_percentile / 100,
                        lambda e: _tpot_met(e, bound_tpot), slots, width)  # fmt: skip
        if s.e2e_s is not None:
            bound_e2e = s.e2e_s
            self._ratio(f"e2e_p{s.e2e_percentile:g}", s.e2e_percentile / 100,
                        lambda e: float(e.at - e.started <= bound_e2e) if _answered(e) else None,
                        slots, width)  # fmt: skip
        if s.availability is not None:
            self._ratio("availability", s.availability, _available, slots, width)
        if s.mean_e2e_s is not None:
            mean_slots = math.ceil(s.window_s / width) + 1
            self.objectives.append(
                _Objective("mean_e2e", "mean", s.mean_e2e_s,
                           lambda e: e.at - e.started if _answered(e) else None,
                           _Ring(mean_slots, width))
            )  # fmt: skip

    def _ratio(
        self,
        name: str,
        target: float,
        judge: Callable[[Finished], float | None],
        slots: int,
        width: float,
    ) -> None:
        self.objectives.append(_Objective(name, "ratio", target, judge, _Ring(slots, width)))

    def record(self, event: Finished) -> None:
        for objective in self.objectives:
            objective.record(event)

    def status(self, now: float) -> list[ObjectiveStatus]:
        return [o.status(now, self.settings.window_s, self.alerts) for o in self.objectives]


def _tpot_met(event: Finished, bound_s: float) -> float | None:
    """1.0 when a whole streamed answer of two tokens or more came at `bound_s` a token or
    faster after its first, 0.0 slower; None for anything else."""
    tokens, ttft = event.output_tokens, event.ttft_s
    if tokens is None or tokens < 2 or ttft is None or not _answered(event):
        return None
    return float(event.at - event.started - ttft <= bound_s * (tokens - 1))


def _answered(event: Finished) -> bool:
    """A whole answer the client got from a backend (a 2xx)."""
    return event.outcome == "answered" and event.status < 300


def _available(event: Finished) -> float | None:
    """1.0 answered (any status under 500), 0.0 a 5xx of a backend's or the gateway's own;
    None for the client's own errors (4xx) and for a client that left first."""
    if event.outcome == "client_closed":
        return None
    if event.status >= 500:
        return 0.0
    return None if event.status >= 400 else 1.0


class SloBook:
    """Every pool's objectives, fed by Finished events from the edge (requests refused before
    routing, with their pool when it was known) and from each pool."""

    def __init__(self, settings: Mapping[str, SloSettings], clock: Callable[[], float]) -> None:
        self._pools: dict[str, PoolSlo] = {}
        self._clock = clock
        self._second = -1  # the clock's second `_status` was worked out in
        self._status: dict[str, list[ObjectiveStatus]] = {}
        self.configure(settings)

    def configure(self, settings: Mapping[str, SloSettings]) -> None:
        """Each pool's objectives (at start, or reloaded): a pool whose objectives did not
        change keeps what it counted."""
        old = self._pools
        self._pools = {
            model: old[model] if model in old and old[model].settings == s else PoolSlo(s)
            for model, s in settings.items()
            if s.any
        }
        self._second = -1

    def subscribe(self, hooks: Hooks) -> None:
        if self._pools:
            hooks.subscribe(Finished, self.on_finished)

    def on_finished(self, event: Finished) -> None:
        pool = self._pools.get(event.model)
        if pool is not None:
            pool.record(event)

    @property
    def pools(self) -> Mapping[str, PoolSlo]:
        return self._pools

    def status(self) -> dict[str, list[ObjectiveStatus]]:
        """Each pool's objectives as they stand now, worked out at most once a second of the
        clock (summing a day's slots takes milliseconds; scrapes and every dashboard stream
        ask)."""
        now = self._clock()
        second = int(now)
        if second != self._second:
            self._second = second
            self._status = {model: pool.status(now) for model, pool in self._pools.items()}
        return self._status
